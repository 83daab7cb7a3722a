"""Builds and trains a small classifier with loom: a 2-layer MLP on three overlapping
Gaussian blobs, fused Adam with its step counter advanced every step. The test accuracy is
checked against the best any classifier can do here (NumPy: the nearest true centre).

    python3 examples/python/train_mlp.py     # prints loss and accuracy; fails if it is poor
"""
import numpy as np

import loom

rng = np.random.default_rng(0)
classes, features, hidden, batch = 3, 8, 32, 64
centres = rng.standard_normal((classes, features)).astype(np.float32) * 0.6


def blobs(n):
    labels = rng.integers(0, classes, n).astype(np.int32)
    points = centres[labels] + rng.standard_normal((n, features)).astype(np.float32)
    return points, labels


g = loom.Graph()
x = g.placeholder("x", loom.float32, [batch, features])
labels = g.placeholder("labels", loom.int32, [batch])
w1 = g.variable("w1", init=rng.standard_normal((features, hidden)).astype(np.float32) * 0.3)
b1 = g.variable("b1", init=np.zeros(hidden, np.float32))
w2 = g.variable("w2", init=rng.standard_normal((hidden, classes)).astype(np.float32) * 0.3)
logits = loom.ops.relu(x @ w1 + b1) @ w2
per_example, _ = loom.ops.softmax_cross_entropy(logits, labels)
loss = loom.ops.reduce_mean(per_example, axes=[0])
params = [w1, b1, w2]
grads = g.gradients(loss, params)
lr, scale = g.constant(np.float32(1e-2)), g.constant(np.float32(1))
step = g.variable("step", init=np.int64(1))
update, grad_norm, found_inf = g.fused_adam(params, grads, lr, step, scale)
next_step = g.op("assign_add", [step, g.constant(np.int64(1))])  # Adam's bias correction

s = loom.Session(g)
train_x, train_y = blobs(4096)
for epoch in range(3):
    for i in range(0, len(train_x), batch):
        value = s.run(loss, {x: train_x[i:i + batch], labels: train_y[i:i + batch]},
                      targets=[update, next_step])
    print(f"epoch {epoch + 1}: loss {float(np.asarray(value)):.4f}")

test_x, test_y = blobs(1024)
correct = 0
for i in range(0, len(test_x), batch):
    predicted = np.asarray(s.run(logits, {x: test_x[i:i + batch]})).argmax(axis=1)
    correct += int((predicted == test_y[i:i + batch]).sum())
accuracy = correct / len(test_x)
# The Bayes-optimal rule for equal, spherical blobs: the nearest centre.
nearest = ((test_x[:, None, :] - centres[None]) ** 2).sum(axis=2).argmin(axis=1)
best = float((nearest == test_y).mean())
print(f"test accuracy {accuracy:.1%} after {int(np.asarray(s.variable('step'))) - 1} steps "
      f"(the nearest true centre: {best:.1%})")
assert int(np.asarray(s.variable("step"))) == 1 + 3 * len(train_x) // batch
assert accuracy >= best - 0.03, (accuracy, best)
