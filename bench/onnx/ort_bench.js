#!/usr/bin/env node
// ONNX Runtime (CPU) as a peer for loom's ONNX benchmarks and parity checks.
//
// Timing mode: builds random inputs of the model's input shapes and times session.run.
//   node ort_bench.js MODEL.onnx --batch B --threads T --warmup W --iters N
//                     [--input NAME] [--shape NAME=d0,d1,...]...
//   --batch B      dimension 0 of the batched inputs (all inputs, or only --input NAME)
//   --shape N=...  the full shape of input N where the model leaves dimensions other than the
//                  batch symbolic (dimension 0 is still replaced by B for a batched input)
//   Prints one JSON line:
//   {ort_version, model, batch, threads, latency_ms: {p50, p90, p99, mean}, samples_per_s}
//
// Feeds mode: runs the model once on inputs read from .npy files and writes its outputs.
//   node ort_bench.js MODEL.onnx --feeds DIR [--out DIR2] [--threads T]
//   Reads DIR/<name>.npy for every model input (name with characters outside
//   [A-Za-z0-9_.-] replaced by '_'), writes DIR2/<name>.npy (default DIR2 = DIR/ort) for every
//   output and prints one JSON line {ort_version, model, outputs: [{name, file, shape, type}]}.
//
// The session: intraOpNumThreads=T, interOpNumThreads=1, sequential execution, graph
// optimization level "all", CPU execution provider.
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const ort = require('onnxruntime-node');

function usage(message) {
  process.stderr.write(`ort_bench: ${message}\n` +
    'usage: node ort_bench.js MODEL.onnx --batch B --threads T --warmup W --iters N ' +
    '[--input NAME] [--shape NAME=d0,d1,...]\n' +
    '       node ort_bench.js MODEL.onnx --feeds DIR [--out DIR] [--threads T]\n');
  process.exit(2);
}

function positiveInt(flag, text, allowZero) {
  const value = Number(text);
  if (!Number.isInteger(value) || value < (allowZero ? 0 : 1)) {
    usage(`${flag} takes a ${allowZero ? 'non-negative' : 'positive'} integer, got '${text}'`);
  }
  return value;
}

function parseArgs(argv) {
  const args = { batch: 1, threads: 1, warmup: 5, iters: 20, input: null, shapes: {},
                 feeds: null, out: null, model: null };
  for (let i = 0; i < argv.length; ++i) {
    const a = argv[i];
    const next = () => {
      if (i + 1 >= argv.length) usage(`${a} needs a value`);
      return argv[++i];
    };
    if (a === '--batch') args.batch = positiveInt(a, next(), false);
    else if (a === '--threads') args.threads = positiveInt(a, next(), false);
    else if (a === '--warmup') args.warmup = positiveInt(a, next(), true);
    else if (a === '--iters') args.iters = positiveInt(a, next(), false);
    else if (a === '--input') args.input = next();
    else if (a === '--feeds') args.feeds = next();
    else if (a === '--out') args.out = next();
    else if (a === '--shape') {
      const spec = next();
      const eq = spec.lastIndexOf('=');
      if (eq <= 0) usage(`--shape takes NAME=d0,d1,..., got '${spec}'`);
      const dims = spec.slice(eq + 1).split(',').map((d) => positiveInt('--shape', d, true));
      args.shapes[spec.slice(0, eq)] = dims;
    } else if (a.startsWith('--')) usage(`unknown option ${a}`);
    else if (args.model === null) args.model = a;
    else usage(`unexpected argument '${a}'`);
  }
  if (args.model === null) usage('no model given');
  return args;
}

// ---- .npy files (format versions 1-3, C order, little-endian) -----------------------------

const NPY_TYPES = {
  '<f4': { ort: 'float32', array: Float32Array },
  '<f8': { ort: 'float64', array: Float64Array },
  '<f2': { ort: 'float16', array: Uint16Array },
  '<i8': { ort: 'int64', array: BigInt64Array },
  '<i4': { ort: 'int32', array: Int32Array },
  '<i2': { ort: 'int16', array: Int16Array },
  '|i1': { ort: 'int8', array: Int8Array },
  '<u8': { ort: 'uint64', array: BigUint64Array },
  '<u4': { ort: 'uint32', array: Uint32Array },
  '<u2': { ort: 'uint16', array: Uint16Array },
  '|u1': { ort: 'uint8', array: Uint8Array },
  '|b1': { ort: 'bool', array: Uint8Array },
};

function readNpy(file) {
  const buf = fs.readFileSync(file);
  if (buf.length < 10 || buf.toString('latin1', 0, 6) !== '\x93NUMPY') {
    throw new Error(`${file}: not a .npy file`);
  }
  const major = buf[6];
  const headerLen = major === 1 ? buf.readUInt16LE(8) : buf.readUInt32LE(8);
  const start = major === 1 ? 10 : 12;
  const header = buf.toString('latin1', start, start + headerLen);
  const descr = /'descr':\s*'([^']+)'/.exec(header);
  const fortran = /'fortran_order':\s*(True|False)/.exec(header);
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header);
  if (!descr || !fortran || !shape) throw new Error(`${file}: unreadable .npy header`);
  if (fortran[1] === 'True') throw new Error(`${file}: Fortran-order arrays are not read`);
  const type = NPY_TYPES[descr[1]];
  if (!type) throw new Error(`${file}: dtype ${descr[1]} is not read`);
  const dims = shape[1].split(',').map((d) => d.trim()).filter((d) => d !== '').map(Number);
  const count = dims.reduce((a, b) => a * b, 1);
  const offset = start + headerLen;
  const bytes = buf.subarray(offset, offset + count * type.array.BYTES_PER_ELEMENT);
  if (bytes.length !== count * type.array.BYTES_PER_ELEMENT) {
    throw new Error(`${file}: ${count} elements expected, the file is short`);
  }
  // Copy into an aligned buffer of the element type.
  const data = new type.array(count);
  new Uint8Array(data.buffer).set(bytes);
  const tensorData = type.ort === 'bool' ? Uint8Array.from(data, (v) => (v ? 1 : 0)) : data;
  return new ort.Tensor(type.ort, tensorData, dims);
}

function writeNpy(file, tensor) {
  const descr = Object.keys(NPY_TYPES).find((k) => NPY_TYPES[k].ort === tensor.type);
  if (!descr) throw new Error(`output of type ${tensor.type} cannot be written as .npy`);
  const dims = tensor.dims.map(String);
  const shape = dims.length === 1 ? `(${dims[0]},)` : `(${dims.join(', ')})`;
  let header = `{'descr': '${descr}', 'fortran_order': False, 'shape': ${shape}, }`;
  // Pad so that the data starts at a multiple of 64 bytes; the header ends in a newline.
  const pad = 64 - ((10 + header.length + 1) % 64);
  header += ' '.repeat(pad % 64) + '\n';
  const head = Buffer.alloc(10);
  head.write('\x93NUMPY', 0, 'latin1');
  head[6] = 1;
  head[7] = 0;
  head.writeUInt16LE(header.length, 8);
  const data = tensor.data;
  const body = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  fs.writeFileSync(file, Buffer.concat([head, Buffer.from(header, 'latin1'), body]));
}

function safeName(name) {
  return name.replace(/[^A-Za-z0-9_.-]/g, '_');
}

// ---- inputs ---------------------------------------------------------------------------------

// A deterministic generator (mulberry32), so that two runs feed the same numbers.
function makeRandom(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function inputShape(meta, args) {
  const batched = args.input === null || args.input === meta.name;
  let dims = args.shapes[meta.name] ? args.shapes[meta.name].slice() : meta.shape.slice();
  if (dims.length === 0 && !args.shapes[meta.name] && meta.shape.length === 0) return [];
  if (batched) {
    if (typeof dims[0] === 'number' && !args.shapes[meta.name] && dims[0] !== args.batch &&
        typeof meta.shape[0] === 'number') {
      throw new Error(`input '${meta.name}' has a static batch dimension ${meta.shape[0]}, ` +
                      `--batch ${args.batch} cannot be fed`);
    }
    dims[0] = args.batch;
  }
  const unknown = dims.findIndex((d) => typeof d !== 'number' || d < 0);
  if (unknown >= 0) {
    throw new Error(`input '${meta.name}' has symbolic dimension ${unknown} ` +
                    `('${meta.shape[unknown]}'): give its shape with --shape ${meta.name}=...`);
  }
  return dims;
}

function randomInput(meta, dims, random) {
  const count = dims.reduce((a, b) => a * b, 1);
  if (meta.type === 'float32') {
    const data = new Float32Array(count);
    for (let i = 0; i < count; ++i) data[i] = random() * 2 - 1;
    return new ort.Tensor('float32', data, dims);
  }
  if (meta.type === 'int64') return new ort.Tensor('int64', new BigInt64Array(count), dims);
  if (meta.type === 'int32') return new ort.Tensor('int32', new Int32Array(count), dims);
  if (meta.type === 'bool') return new ort.Tensor('bool', new Uint8Array(count), dims);
  throw new Error(`input '${meta.name}' of type ${meta.type}: only float32 inputs are random`);
}

function percentile(sorted, p) {
  // Nearest rank.
  const rank = Math.max(1, Math.ceil((p / 100) * sorted.length));
  return sorted[Math.min(rank, sorted.length) - 1];
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const options = {
    executionProviders: ['cpu'],
    intraOpNumThreads: args.threads,
    interOpNumThreads: 1,
    executionMode: 'sequential',
    graphOptimizationLevel: 'all',
  };
  const session = await ort.InferenceSession.create(args.model, options);
  const version = ort.env.versions.node || ort.env.versions.common;

  if (args.feeds !== null) {
    const feeds = {};
    for (const name of session.inputNames) {
      feeds[name] = readNpy(path.join(args.feeds, `${safeName(name)}.npy`));
    }
    const results = await session.run(feeds);
    const out = args.out || path.join(args.feeds, 'ort');
    fs.mkdirSync(out, { recursive: true });
    const outputs = session.outputNames.map((name) => {
      const file = path.join(out, `${safeName(name)}.npy`);
      writeNpy(file, results[name]);
      return { name, file, shape: results[name].dims, type: results[name].type };
    });
    process.stdout.write(`${JSON.stringify({ ort_version: version, model: args.model, outputs })}\n`);
    return;
  }

  if (args.input !== null && !session.inputNames.includes(args.input)) {
    throw new Error(`--input ${args.input}: the model's inputs are ${session.inputNames.join(', ')}`);
  }
  const random = makeRandom(0);
  const feeds = {};
  for (const meta of session.inputMetadata) {
    if (!meta.isTensor) throw new Error(`input '${meta.name}' is not a tensor`);
    feeds[meta.name] = randomInput(meta, inputShape(meta, args), random);
  }
  for (let i = 0; i < args.warmup; ++i) await session.run(feeds);
  const samples = [];
  for (let i = 0; i < args.iters; ++i) {
    const t0 = process.hrtime.bigint();
    await session.run(feeds);
    samples.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  const sorted = samples.slice().sort((a, b) => a - b);
  const mean = samples.reduce((a, b) => a + b, 0) / samples.length;
  const round = (x) => Math.round(x * 1e4) / 1e4;
  process.stdout.write(`${JSON.stringify({
    ort_version: version,
    model: args.model,
    batch: args.batch,
    threads: args.threads,
    latency_ms: { p50: round(percentile(sorted, 50)), p90: round(percentile(sorted, 90)),
                  p99: round(percentile(sorted, 99)), mean: round(mean) },
    samples_per_s: round((args.batch * 1000) / percentile(sorted, 50)),
  })}\n`);
}

main().catch((err) => {
  process.stderr.write(`ort_bench: ${err && err.message ? err.message : err}\n`);
  process.exit(1);
});
