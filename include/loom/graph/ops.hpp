// Every op's builder functions (loom::ops), one header per family.
#pragma once

#include "loom/graph/builder.hpp"
#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/nn.hpp"
#include "loom/graph/ops/normalization.hpp"
#include "loom/graph/ops/optimizer.hpp"
#include "loom/graph/ops/reduction.hpp"
#include "loom/graph/ops/state.hpp"
