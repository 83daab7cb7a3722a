// DLPack in C++: exports read back by walking the structs by hand, imports of managed
// tensors built here the way an independent producer builds them (its own memory, its own
// deleter counting calls), round trips of every dtype, layout and ABI, zero copy (a write on
// one side seen on the other), lifetimes (the deleter runs once, after the last reference),
// read-only imports never written in place, loans, and every bad-input path leaving the
// caller's struct untouched.
#include "loom/interop/dlpack.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/graph/builder.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/loans.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/memory/tracking_adaptor.hpp"
#include "loom/runtime/session.hpp"

namespace loom::interop {
namespace {

// The type codes as the DLPack specification numbers them (not loom's own constants).
constexpr std::uint8_t spec_int = 0, spec_uint = 1, spec_float = 2, spec_bfloat = 4,
                       spec_complex = 5, spec_bool = 6;

constexpr dtype all_types[] = {dtype::f32, dtype::f64, dtype::f16, dtype::bf16,   dtype::i32,
                               dtype::i64, dtype::i8,  dtype::u8,  dtype::boolean};

TEST(DlpackTypes, MatchTheSpecification) {
  struct row {
    dtype t;
    std::uint8_t code, bits;
  };
  const row rows[] = {
      {dtype::f32, spec_float, 32},   {dtype::f64, spec_float, 64}, {dtype::f16, spec_float, 16},
      {dtype::bf16, spec_bfloat, 16}, {dtype::i32, spec_int, 32},   {dtype::i64, spec_int, 64},
      {dtype::i8, spec_int, 8},       {dtype::u8, spec_uint, 8},    {dtype::boolean, spec_bool, 8}};
  for (const row& r : rows) {
    const DLDataType d = to_dl_data_type(r.t);
    EXPECT_EQ(d.code, r.code) << to_string(r.t);
    EXPECT_EQ(d.bits, r.bits) << to_string(r.t);
    EXPECT_EQ(d.lanes, 1) << to_string(r.t);
    EXPECT_EQ(dtype_from_dl(d), r.t);
  }
  const DLDataType unsupported[] = {{spec_int, 16, 1},     {spec_uint, 32, 1},  {spec_float, 8, 1},
                                    {spec_complex, 64, 1}, {spec_float, 32, 4}, {3, 64, 1},
                                    {spec_bool, 1, 1},     {99, 8, 1}};
  for (const DLDataType& d : unsupported) {
    EXPECT_THROW((void)dtype_from_dl(d), unsupported_error) << int(d.code) << " " << int(d.bits);
  }
  try {
    (void)dtype_from_dl({spec_int, 16, 1});
    FAIL();
  } catch (const unsupported_error& e) {
    EXPECT_NE(std::string(e.what()).find("int16"), std::string::npos) << e.what();
  }
}

// A tensor of `t` and shape `s` whose element i holds (i % 97) + 1 (or i % 2 for bool).
tensor filled(dtype t, const shape& s) {
  tensor x = memory::host_tensor(t, s);
  auto* p = static_cast<std::byte*>(x.raw_data());
  const std::size_t es = size_of(t);
  for (std::int64_t i = 0; i < s.num_elements(); ++i) {
    const auto v = static_cast<std::uint64_t>(t == dtype::boolean ? i % 2 : i % 97 + 1);
    std::memcpy(p + static_cast<std::size_t>(i) * es, &v, es);  // little-endian low bytes
  }
  return x;
}

// Element (index) of a DLTensor, read by the specification's rule: data + byte_offset +
// sum(index[k] * strides[k]) * itemsize, as raw bytes.
std::uint64_t read_dl(const DLTensor& d, const std::vector<std::int64_t>& index) {
  std::int64_t at = 0;
  std::int64_t row_major = 1;
  for (int k = d.ndim; k-- > 0;) {
    const std::int64_t stride = d.strides != nullptr ? d.strides[k] : row_major;
    at += index[static_cast<std::size_t>(k)] * stride;
    row_major *= d.shape[k];
  }
  const std::size_t es = d.dtype.bits / 8u;
  std::uint64_t v = 0;
  std::memcpy(
      &v,
      static_cast<const std::byte*>(d.data) + d.byte_offset + at * static_cast<std::int64_t>(es),
      es);
  return v;
}

// Every index of `s`, row-major.
std::vector<std::vector<std::int64_t>> indices(const shape& s) {
  std::vector<std::vector<std::int64_t>> out;
  if (s.num_elements() == 0) return out;
  std::vector<std::int64_t> i(s.rank(), 0);
  for (;;) {
    out.push_back(i);
    std::size_t k = s.rank();
    while (k > 0 && ++i[k - 1] == s[k - 1]) i[--k] = 0;
    if (k == 0) return out;
  }
}

// Element (index) of a loom tensor, by its strides.
std::uint64_t read_loom(const tensor& t, const std::vector<std::int64_t>& index) {
  std::int64_t at = 0;
  for (std::size_t k = 0; k < index.size(); ++k) at += index[k] * t.strides()[k];
  const std::size_t es = size_of(t.type());
  std::uint64_t v = 0;
  std::memcpy(&v, static_cast<const std::byte*>(t.raw_data()) + at * static_cast<std::int64_t>(es),
              es);
  return v;
}

TEST(DlpackExport, DescribesTheTensorByTheSpecification) {
  for (const dtype t : all_types) {
    for (const shape& s : {shape{}, shape{0}, shape{5}, shape{2, 3, 4}, shape{3, 0, 2}}) {
      const tensor x = filled(t, s);
      for (int versioned = 0; versioned < 2; ++versioned) {
        SCOPED_TRACE(std::string(to_string(t)) + " " + to_string(s) +
                     (versioned ? " versioned" : " legacy"));
        DLManagedTensor* legacy = versioned ? nullptr : to_dlpack(x);
        DLManagedTensorVersioned* v1 = versioned ? to_dlpack_versioned(x) : nullptr;
        const DLTensor& d = versioned ? v1->dl_tensor : legacy->dl_tensor;
        if (versioned) {
          EXPECT_EQ(v1->version.major, 1u);
          EXPECT_EQ(v1->flags, 0u);
        }
        EXPECT_EQ(d.device.device_type, kDLCPU);
        EXPECT_EQ(d.ndim, static_cast<int>(s.rank()));
        EXPECT_EQ(d.dtype.code, to_dl_data_type(t).code);
        for (std::size_t k = 0; k < s.rank(); ++k) EXPECT_EQ(d.shape[k], s[k]);
        EXPECT_EQ(d.data, x.raw_data()) << "zero copy";
        for (const auto& i : indices(s)) ASSERT_EQ(read_dl(d, i), read_loom(x, i));
        if (versioned) {
          v1->deleter(v1);
        } else {
          legacy->deleter(legacy);
        }
      }
    }
  }
}

TEST(DlpackExport, StridedViewsKeepTheirLayout) {
  // A transposed view and a reversed view (negative stride) of a [3, 4] f32 tensor.
  const tensor base = filled(dtype::f32, {3, 4});
  const tensor transposed = tensor::strided(base.buf(), dtype::f32, {4, 3}, {1, 4}, 0);
  const tensor reversed = tensor::strided(base.buf(), dtype::f32, {3, 4}, {-4, 1}, 8);
  for (const tensor& v : {transposed, reversed}) {
    DLManagedTensorVersioned* m = to_dlpack_versioned(v);
    for (std::size_t k = 0; k < v.rank(); ++k) EXPECT_EQ(m->dl_tensor.strides[k], v.strides()[k]);
    for (const auto& i : indices(v.shape())) ASSERT_EQ(read_dl(m->dl_tensor, i), read_loom(v, i));
    m->deleter(m);
  }
}

TEST(DlpackExport, TheBufferLivesUntilTheDeleterRunsAndTheLoanShowsIt) {
  memory::tracking_adaptor tracker(memory::host_resource::instance(),
                                   {.name = "dlpack", .on_leak = memory::leak_action::ignore});
  DLManagedTensor* m = nullptr;
  {
    tensor x = memory::allocate_tensor(tracker, device_id{device_type::cpu, 0}, dtype::f32, {256});
    std::iota(x.data<float>(), x.data<float>() + 256, 0.0f);
    m = to_dlpack(x);
  }
  // The loom tensor is gone; the consumer still holds the memory, and it is a loan.
  EXPECT_EQ(tracker.outstanding_count(), 1u);
  EXPECT_EQ(static_cast<const float*>(m->dl_tensor.data)[255], 255.0f);
  bool found = false;
  for (const auto& l : memory::outstanding_loans()) found |= l.pointer == m->dl_tensor.data;
  EXPECT_TRUE(found);
  const std::string report = tracker.leak_report();
  EXPECT_NE(report.find("lent to DLPack"), std::string::npos) << report;
  m->deleter(m);
  EXPECT_EQ(tracker.outstanding_count(), 0u);
  for (const auto& l : memory::outstanding_loans()) EXPECT_NE(l.borrower, "DLPack (dltensor)");
}

// ---- import from an independent producer ------------------------------------------------

// A producer's managed tensor over malloc'd memory, with its own shape and strides arrays
// and a deleter that counts its calls.
template <class Managed>
struct producer {
  std::vector<std::int64_t> dims;
  std::vector<std::int64_t> strides;
  void* memory = nullptr;
  int deleted = 0;
  bool keep_memory = false;  // the deleter leaves the memory to the destructor
  Managed managed{};

  producer(DLDataType type, std::vector<std::int64_t> shape_, std::vector<std::int64_t> strides_,
           std::size_t bytes, std::uint64_t byte_offset = 0)
      : dims(std::move(shape_)), strides(std::move(strides_)) {
    memory = bytes == 0 ? nullptr : std::malloc(bytes);
    DLTensor& d = managed.dl_tensor;
    d.data = memory;
    d.byte_offset = byte_offset;
    d.device = DLDevice{kDLCPU, 0};
    d.ndim = static_cast<std::int32_t>(dims.size());
    d.dtype = type;
    d.shape = dims.data();
    d.strides = strides.empty() ? nullptr : strides.data();
    managed.manager_ctx = this;
    managed.deleter = [](Managed* self) {
      auto* p = static_cast<producer*>(self->manager_ctx);
      ++p->deleted;
      if (!p->keep_memory) {
        std::free(p->memory);
        p->memory = nullptr;
      }
    };
  }
  producer(const producer&) = delete;
  producer& operator=(const producer&) = delete;
  ~producer() { std::free(memory); }
};

TEST(DlpackImport, ZeroCopyWithTheProducersLayout) {
  // A [3, 4] f32 matrix in column-major order, reached through a byte offset.
  producer<DLManagedTensor> p({spec_float, 32, 1}, {3, 4}, {1, 3}, 16 + 12 * 4, 16);
  float* values = reinterpret_cast<float*>(static_cast<std::byte*>(p.memory) + 16);
  for (int i = 0; i < 12; ++i) values[i] = static_cast<float>(i);
  {
    tensor t = from_dlpack(&p.managed);
    EXPECT_EQ(t.shape(), (shape{3, 4}));
    EXPECT_EQ(t.type(), dtype::f32);
    EXPECT_FALSE(t.is_contiguous());
    EXPECT_FALSE(t.buf()->read_only());
    for (std::int64_t r = 0; r < 3; ++r) {
      for (std::int64_t c = 0; c < 4; ++c) {
        EXPECT_EQ(read_loom(t, {r, c}), read_dl(p.managed.dl_tensor, {r, c}));
      }
    }
    // A write through loom is seen by the producer.
    *static_cast<float*>(t.raw_data()) = 42.0f;
    EXPECT_EQ(values[0], 42.0f);
    tensor copy = t;
    t = tensor();
    EXPECT_EQ(p.deleted, 0) << "a copy still refers to the memory";
  }
  EXPECT_EQ(p.deleted, 1);
}

TEST(DlpackImport, NegativeStridesRowMajorDefaultsScalarsAndEmpty) {
  {
    // Rows reversed: data points at the last row, stride -4.
    producer<DLManagedTensorVersioned> p({spec_int, 32, 1}, {3, 4}, {-4, 1}, 12 * 4, 8 * 4);
    p.managed.version = {1, 0};
    auto* v = static_cast<std::int32_t*>(p.memory);
    std::iota(v, v + 12, 0);
    const tensor t = from_dlpack(&p.managed);
    for (std::int64_t r = 0; r < 3; ++r) {
      for (std::int64_t c = 0; c < 4; ++c) {
        EXPECT_EQ(static_cast<std::int64_t>(read_loom(t, {r, c})), (2 - r) * 4 + c);
      }
    }
  }
  {
    // No strides: compact row-major.
    producer<DLManagedTensor> p({spec_float, 64, 1}, {2, 3}, {}, 6 * 8);
    auto* v = static_cast<double*>(p.memory);
    std::iota(v, v + 6, 1.0);
    const tensor t = from_dlpack(&p.managed);
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_EQ(t.data<double>()[5], 6.0);
  }
  {
    producer<DLManagedTensor> p({spec_bool, 8, 1}, {}, {}, 1);
    *static_cast<std::uint8_t*>(p.memory) = 1;
    const tensor t = from_dlpack(&p.managed);
    EXPECT_EQ(t.rank(), 0u);
    EXPECT_EQ(t.type(), dtype::boolean);
    EXPECT_EQ(*static_cast<const std::uint8_t*>(t.raw_data()), 1);
  }
  {
    // Empty, with null data: allowed.
    producer<DLManagedTensor> p({spec_bfloat, 16, 1}, {4, 0}, {}, 0);
    const tensor t = from_dlpack(&p.managed);
    EXPECT_EQ(t.num_elements(), 0);
    EXPECT_EQ(t.type(), dtype::bf16);
  }
}

TEST(DlpackImport, RoundTripsOfEveryTypeAndBothAbis) {
  for (const dtype t : all_types) {
    const tensor x = filled(t, {4, 5});
    const tensor view = tensor::strided(x.buf(), t, {5, 2}, {1, 10}, 2);  // a strided view
    for (const tensor& src : {x, view}) {
      const tensor a = from_dlpack(to_dlpack(src));
      const tensor b = from_dlpack(to_dlpack_versioned(src));
      for (const tensor* back : {&a, &b}) {
        EXPECT_EQ(back->type(), t);
        EXPECT_EQ(back->shape(), src.shape());
        EXPECT_EQ(back->raw_data(), src.raw_data()) << "zero copy both ways";
        for (const auto& i : indices(src.shape()))
          ASSERT_EQ(read_loom(*back, i), read_loom(src, i));
      }
    }
  }
}

TEST(DlpackImport, ReadOnlyImportsAreNeverWrittenInPlace) {
  // A variable whose value nobody else holds is updated in place (variable_store): an
  // imported writable value is updated in the producer's memory, a read-only one never is.
  for (const bool read_only : {false, true}) {
    SCOPED_TRACE(read_only ? "read-only" : "writable");
    producer<DLManagedTensorVersioned> p({spec_float, 32, 1}, {1024}, {}, 1024 * 4);
    p.keep_memory = true;  // so it can be inspected after the deleter ran
    p.managed.version = {1, 0};
    p.managed.flags = read_only ? DLPACK_FLAG_BITMASK_READ_ONLY : 0;
    auto* v = static_cast<float*>(p.memory);
    std::iota(v, v + 1024, 0.0f);
    graph g;
    graph_builder b(g);
    auto var = ops::variable(b, "v", dtype::f32, {1024});
    auto d = ops::placeholder(b, "d", dtype::f32, {1024});
    const std::string update = ops::assign_add(var, d).name();
    session s(std::move(g));
    s.variables().get("v").value = from_dlpack(&p.managed);
    EXPECT_EQ(s.variables().get("v").value.buf()->read_only(), read_only);
    const tensor ones = memory::host_tensor<float>({1024}, std::vector<float>(1024, 1.0f));
    (void)s.run({{"d", ones}}, {}, {update});
    const tensor& now = s.variables().get("v").value;
    EXPECT_EQ(now.data<float>()[7], 8.0f);
    if (read_only) {
      EXPECT_NE(now.raw_data(), p.memory);
      for (int i = 0; i < 1024; ++i) ASSERT_EQ(v[i], static_cast<float>(i)) << i;
      EXPECT_EQ(p.deleted, 1) << "the variable let go of the import";
    } else {
      EXPECT_EQ(now.raw_data(), p.memory) << "updated in place";
      EXPECT_EQ(v[3], 4.0f);
    }
    s.variables().clear();
    EXPECT_EQ(p.deleted, 1);
  }
}

TEST(DlpackImport, ReadOnlyFlagSurvivesReexport) {
  producer<DLManagedTensorVersioned> p({spec_int, 64, 1}, {3}, {}, 24);
  p.managed.version = {1, 0};
  p.managed.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
  {
    const tensor t = from_dlpack(&p.managed);
    DLManagedTensorVersioned* m = to_dlpack_versioned(t);
    EXPECT_NE(m->flags & DLPACK_FLAG_BITMASK_READ_ONLY, 0u);
    m->deleter(m);
  }
  EXPECT_EQ(p.deleted, 1);
}

TEST(DlpackImport, BadInputThrowsAndLeavesTheStructToTheCaller) {
  struct bad_case {
    const char* what;
    std::function<void(DLManagedTensorVersioned&)> spoil;
    bool unsupported;  // unsupported_error, else invalid_argument
    const char* mentions;
  };
  const std::vector<bad_case> cases{
      {"int16",
       [](auto& m) {
         m.dl_tensor.dtype = {spec_int, 16, 1};
       },
       true, "int16"},
      {"lanes",
       [](auto& m) {
         m.dl_tensor.dtype = {spec_float, 32, 4};
       },
       true, "lanes"},
      {"complex",
       [](auto& m) {
         m.dl_tensor.dtype = {spec_complex, 64, 1};
       },
       true, "complex"},
      {"opencl",
       [](auto& m) {
         m.dl_tensor.device = {kDLOpenCL, 0};
       },
       true, "opencl"},
      {"device code",
       [](auto& m) { m.dl_tensor.device.device_type = static_cast<DLDeviceType>(77); }, false,
       "77"},
      {"negative ndim", [](auto& m) { m.dl_tensor.ndim = -1; }, false, "ndim"},
      {"null shape", [](auto& m) { m.dl_tensor.shape = nullptr; }, false, "null shape"},
      {"negative dim", [](auto& m) { m.dl_tensor.shape[1] = -2; }, false, "-2"},
      {"count overflow",
       [](auto& m) {
         m.dl_tensor.shape[0] = std::int64_t{1} << 40;
         m.dl_tensor.shape[1] = std::int64_t{1} << 40;
       },
       false, "overflows"},
      {"stride overflow",
       [](auto& m) { m.dl_tensor.strides[0] = std::numeric_limits<std::int64_t>::max() / 2; },
       false, "stride"},
      {"null data", [](auto& m) { m.dl_tensor.data = nullptr; }, false, "null data"},
      // A wild ndim is refused before the shape array is read (it has 2 entries here).
      {"absurd ndim", [](auto& m) { m.dl_tensor.ndim = 1 << 30; }, false, "ndim 1073741824"},
      {"ndim past the limit", [](auto& m) { m.dl_tensor.ndim = max_import_rank + 1; }, false,
       "at most 64"},
      {"misaligned byte_offset", [](auto& m) { m.dl_tensor.byte_offset = 2; }, false,
       "not aligned to the 4-byte elements"},
      {"misaligned data",
       [](auto& m) { m.dl_tensor.data = static_cast<std::byte*>(m.dl_tensor.data) + 1; }, false,
       "not aligned"},
      {"byte_offset wraps",
       [](auto& m) { m.dl_tensor.byte_offset = std::numeric_limits<std::uint64_t>::max() - 3; },
       false, "wraps around the address space"},
      {"negative strides reach below address 0",
       [](auto& m) {
         m.dl_tensor.data = reinterpret_cast<void*>(std::uintptr_t{64});
         m.dl_tensor.strides[0] = -(std::int64_t{1} << 40);
       },
       false, "wraps around the address space"},
      {"strides reach past the last address",
       [](auto& m) {
         m.dl_tensor.data =
             reinterpret_cast<void*>(std::numeric_limits<std::uintptr_t>::max() - 15);
       },
       false, "wraps around the address space"},
      {"span of the strides overflows",
       [](auto& m) {
         m.dl_tensor.strides[0] = std::numeric_limits<std::int64_t>::max() / 4;
         m.dl_tensor.strides[1] = -(std::numeric_limits<std::int64_t>::max() / 4);
         m.dl_tensor.shape[1] = 3;
       },
       false, "64 bits"},
      {"version",
       [](auto& m) {
         m.version = {2, 0};
       },
       true, "version 2.0"},
  };
  for (const bad_case& c : cases) {
    SCOPED_TRACE(c.what);
    producer<DLManagedTensorVersioned> p({spec_float, 32, 1}, {3, 4}, {4, 1}, 48);
    p.managed.version = {1, 0};
    c.spoil(p.managed);
    try {
      (void)from_dlpack(&p.managed);
      ADD_FAILURE() << "no error";
    } catch (const unsupported_error& e) {
      EXPECT_TRUE(c.unsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.mentions), std::string::npos) << e.what();
    } catch (const invalid_argument& e) {
      EXPECT_FALSE(c.unsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.mentions), std::string::npos) << e.what();
    }
    EXPECT_EQ(p.deleted, 0) << "the caller still owns the struct";
  }
  EXPECT_THROW((void)from_dlpack(static_cast<DLManagedTensor*>(nullptr)), invalid_argument);
  EXPECT_THROW((void)from_dlpack(static_cast<DLManagedTensorVersioned*>(nullptr)),
               invalid_argument);
}

}  // namespace
}  // namespace loom::interop
