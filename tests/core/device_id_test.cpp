// Device names (Note [device names]), device specs, and the DLPack device conversion.
#include "loom/core/device_id.hpp"

#include <dlpack/dlpack.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "loom/core/dlpack_device.hpp"
#include "loom/core/error.hpp"

namespace {

using loom::device_id;
using loom::device_spec;
using loom::device_type;
using loom::parse_device_id;
using loom::parse_device_spec;

// The message of the invalid_argument that `fn` throws ("" when it throws none).
template <class Fn>
std::string invalid_argument_message(Fn&& fn) {
  try {
    fn();
  } catch (const loom::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// DLPack 0.6's codes and upper-case names, written out independently of loom's tables.
struct dlpack_type {
  int code;
  const char* upper;
  const char* lower;
};
const std::vector<dlpack_type> dlpack_types = {
    {kDLCPU, "CPU", "cpu"},
    {kDLCUDA, "CUDA", "cuda"},
    {kDLCUDAHost, "CUDA_HOST", "cuda_host"},
    {kDLOpenCL, "OPENCL", "opencl"},
    {kDLVulkan, "VULKAN", "vulkan"},
    {kDLMetal, "METAL", "metal"},
    {kDLVPI, "VPI", "vpi"},
    {kDLROCM, "ROCM", "rocm"},
    {kDLROCMHost, "ROCM_HOST", "rocm_host"},
    {kDLExtDev, "EXT_DEV", "ext_dev"},
    {kDLCUDAManaged, "CUDA_MANAGED", "cuda_managed"},
};

TEST(DeviceId, EveryDLPackTypeHasADeviceType) {
  ASSERT_EQ(std::size(loom::all_device_types), dlpack_types.size());
  for (std::size_t i = 0; i < dlpack_types.size(); ++i) {
    EXPECT_EQ(static_cast<int>(loom::all_device_types[i]), dlpack_types[i].code);
    EXPECT_STREQ(loom::to_string(loom::all_device_types[i]), dlpack_types[i].lower);
    EXPECT_TRUE(loom::is_valid_device_type(dlpack_types[i].code));
  }
  for (int code : {-1, 0, 5, 6, 14, 15, 16, 100}) {
    EXPECT_FALSE(loom::is_valid_device_type(code)) << code;
  }
  EXPECT_STREQ(loom::to_string(static_cast<device_type>(42)), "unknown");
}

TEST(DeviceId, FullNames) {
  EXPECT_EQ(loom::full_name({device_type::cpu, 0}), "/device:CPU:0");
  EXPECT_EQ(loom::full_name({device_type::cuda, 1}), "/device:CUDA:1");
  EXPECT_EQ(loom::full_name({device_type::cuda_host, 0}), "/device:CUDA_HOST:0");
  EXPECT_EQ(loom::full_name({device_type::cuda_managed, 3}), "/device:CUDA_MANAGED:3");
  EXPECT_EQ(loom::full_name({device_type::rocm_host, 2147483647}), "/device:ROCM_HOST:2147483647");
  EXPECT_EQ(loom::full_name({static_cast<device_type>(99), 2}), "/device:UNKNOWN(99):2");
  EXPECT_EQ(loom::to_string(device_id{device_type::cuda_host, 2}), "cuda_host:2");
}

TEST(DeviceId, ParsesFullAndShortForms) {
  const device_id cpu0{device_type::cpu, 0};
  const device_id cuda1{device_type::cuda, 1};
  EXPECT_EQ(parse_device_id("/device:CPU:0"), cpu0);
  EXPECT_EQ(parse_device_id("/device:cpu:0"), cpu0);
  EXPECT_EQ(parse_device_id("/device:Cpu:0"), cpu0);
  EXPECT_EQ(parse_device_id("cpu:0"), cpu0);
  EXPECT_EQ(parse_device_id("CPU:0"), cpu0);
  EXPECT_EQ(parse_device_id("/device:GPU:1"), cuda1);
  EXPECT_EQ(parse_device_id("/device:CUDA:1"), cuda1);
  EXPECT_EQ(parse_device_id("/device:gpu:1"), cuda1);
  EXPECT_EQ(parse_device_id("cuda:1"), cuda1);
  EXPECT_EQ(parse_device_id("gpu:1"), cuda1);
  EXPECT_EQ(parse_device_id("GPU:1"), cuda1);
  EXPECT_EQ(parse_device_id("cuda_host:0"), (device_id{device_type::cuda_host, 0}));
  EXPECT_EQ(parse_device_id("/device:Cuda_Managed:7"), (device_id{device_type::cuda_managed, 7}));
  EXPECT_EQ(parse_device_id("cpu:2147483647"), (device_id{device_type::cpu, 2147483647}));
  EXPECT_EQ(parse_device_id("cpu:007"), (device_id{device_type::cpu, 7}));
}

TEST(DeviceId, RejectsMalformedNames) {
  const std::vector<std::string> bad = {
      "",
      "cpu:",
      "cpu:-1",
      "cpu:x",
      "tpu:0",
      "/device:CPU",
      "cpu:0:1",
      "cpu:99999999999",
      "cpu:2147483648",
      " cpu:0",
      "cpu:0 ",
      "cpu: 0",
      "cpu :0",
      "cpu",
      ":0",
      "/device:",
      "/device::0",
      "/device:CPU:",
      "/device:CPU:0:0",
      "device:CPU:0",
      "/DEVICE:CPU:0",
      "cpu:+1",
      "cpu:1.0",
      "cpu:0x1",
      "*:0",
      "cpu:*",
      "*",
      "/device:CPU:*",
      "gpu_host:0",
      "/job:a/device:CPU:0",
  };
  for (const std::string& text : bad) {
    const std::string message = invalid_argument_message([&] { (void)parse_device_id(text); });
    ASSERT_FALSE(message.empty()) << "accepted \"" << text << "\"";
    // The message quotes the text and says what was expected.
    EXPECT_NE(message.find("\"" + text + "\""), std::string::npos) << message;
    EXPECT_NE(message.find("expected"), std::string::npos) << message;
  }
}

TEST(DeviceId, MessagesEscapeWhatTheyQuote) {
  const std::string message =
      invalid_argument_message([] { (void)parse_device_id(std::string_view("cpu:0\0\n\\", 8)); });
  EXPECT_NE(message.find("\"cpu:0\\x00\\x0a\\\\\""), std::string::npos) << message;
  EXPECT_NE(message.find("expected"), std::string::npos) << message;
  const std::string quoted = invalid_argument_message([] { (void)parse_device_id("cpu:\"0\""); });
  EXPECT_NE(quoted.find("\"cpu:\\\"0\\\"\""), std::string::npos) << quoted;
}

TEST(DeviceId, MessagesSayWhatIsWrong) {
  auto message = [](std::string_view text) {
    return invalid_argument_message([&] { (void)parse_device_id(text); });
  };
  EXPECT_NE(message("tpu:0").find("unknown device type \"tpu\""), std::string::npos);
  EXPECT_NE(message("cpu:99999999999").find("below 2^31"), std::string::npos);
  EXPECT_NE(message("/device:CPU").find("index is missing"), std::string::npos);
  EXPECT_NE(message("cpu:0:1").find("more than two fields"), std::string::npos);
}

TEST(DeviceId, NameRoundTripsForEveryType) {
  for (device_type t : loom::all_device_types) {
    for (std::int32_t index : {0, 1, 17, 2147483647}) {
      const device_id d{t, index};
      EXPECT_EQ(parse_device_id(loom::full_name(d)), d) << loom::full_name(d);
      EXPECT_EQ(parse_device_id(loom::to_string(d)), d) << loom::to_string(d);
      EXPECT_EQ(loom::full_name(parse_device_id(loom::full_name(d))), loom::full_name(d));
    }
  }
  for (const dlpack_type& t : dlpack_types) {
    const std::string name = std::string("/device:") + t.upper + ":3";
    EXPECT_EQ(loom::full_name(parse_device_id(name)), name);
    EXPECT_EQ(static_cast<int>(parse_device_id(name).type), t.code);
  }
}

TEST(DeviceSpec, ParsesPartialForms) {
  EXPECT_EQ(parse_device_spec(""), device_spec{});
  EXPECT_EQ(parse_device_spec("*"), device_spec{});
  EXPECT_EQ(parse_device_spec("/device:*"), device_spec{});
  EXPECT_EQ(parse_device_spec("cpu"), (device_spec{device_type::cpu, std::nullopt}));
  EXPECT_EQ(parse_device_spec("CPU"), (device_spec{device_type::cpu, std::nullopt}));
  EXPECT_EQ(parse_device_spec("/device:CPU"), (device_spec{device_type::cpu, std::nullopt}));
  EXPECT_EQ(parse_device_spec("/device:CPU:*"), (device_spec{device_type::cpu, std::nullopt}));
  EXPECT_EQ(parse_device_spec("cpu:*"), (device_spec{device_type::cpu, std::nullopt}));
  EXPECT_EQ(parse_device_spec("cuda"), (device_spec{device_type::cuda, std::nullopt}));
  EXPECT_EQ(parse_device_spec("gpu"), (device_spec{device_type::cuda, std::nullopt}));
  EXPECT_EQ(parse_device_spec("*:1"), (device_spec{std::nullopt, 1}));
  EXPECT_EQ(parse_device_spec("/device:*:1"), (device_spec{std::nullopt, 1}));
  // Everything parse_device_id accepts.
  EXPECT_EQ(parse_device_spec("/device:GPU:1"), (device_spec{device_type::cuda, 1}));
  EXPECT_EQ(parse_device_spec("cpu:0"), (device_spec{device_type::cpu, 0}));
}

TEST(DeviceSpec, RejectsMalformedSpecs) {
  const std::vector<std::string> bad = {
      "cpu:", "cpu:-1",     "cpu:x",   "tpu",    "tpu:0",    "cpu:0:1", "cpu:99999999999",
      " cpu", "cpu ",       ":0",      ":",      "/device:", "**",      "*:",
      "*:x",  "/device::*", "cpu:*:*", "cpu:**",
  };
  for (const std::string& text : bad) {
    const std::string message = invalid_argument_message([&] { (void)parse_device_spec(text); });
    ASSERT_FALSE(message.empty()) << "accepted \"" << text << "\"";
    EXPECT_NE(message.find("\"" + text + "\""), std::string::npos) << message;
    EXPECT_NE(message.find("expected"), std::string::npos) << message;
  }
}

TEST(DeviceSpec, Matches) {
  const device_id cpu0{device_type::cpu, 0};
  const device_id cpu1{device_type::cpu, 1};
  const device_id cuda1{device_type::cuda, 1};
  EXPECT_TRUE(parse_device_spec("").matches(cpu0));
  EXPECT_TRUE(parse_device_spec("").matches(cuda1));
  EXPECT_TRUE(parse_device_spec("cpu").matches(cpu0));
  EXPECT_TRUE(parse_device_spec("cpu").matches(cpu1));
  EXPECT_FALSE(parse_device_spec("cpu").matches(cuda1));
  EXPECT_TRUE(parse_device_spec("cpu:1").matches(cpu1));
  EXPECT_FALSE(parse_device_spec("cpu:1").matches(cpu0));
  EXPECT_FALSE(parse_device_spec("cpu:1").matches(cuda1));
  EXPECT_TRUE(parse_device_spec("*:1").matches(cpu1));
  EXPECT_TRUE(parse_device_spec("*:1").matches(cuda1));
  EXPECT_FALSE(parse_device_spec("*:1").matches(cpu0));
  EXPECT_TRUE(parse_device_spec("/device:GPU:1").matches(cuda1));
}

TEST(DeviceSpec, ToStringRoundTrips) {
  EXPECT_EQ(device_spec{}.to_string(), "*");
  EXPECT_EQ((device_spec{device_type::cpu, std::nullopt}).to_string(), "cpu");
  EXPECT_EQ((device_spec{device_type::cuda, 2}).to_string(), "cuda:2");
  EXPECT_EQ((device_spec{std::nullopt, 2}).to_string(), "*:2");
  std::vector<device_spec> specs = {device_spec{}, device_spec{std::nullopt, 5}};
  for (device_type t : loom::all_device_types) {
    specs.push_back(device_spec{t, std::nullopt});
    specs.push_back(device_spec{t, 0});
    specs.push_back(device_spec{t, 12});
  }
  for (const device_spec& s : specs) {
    EXPECT_EQ(parse_device_spec(s.to_string()), s) << s.to_string();
  }
}

// A DLDevice whose type field holds `code`, written as an integer (storing a code outside
// DLDeviceType's range through the enum type would be undefined behaviour).
DLDevice raw_dl_device(std::int32_t code, int index) {
  DLDevice d{};
  static_assert(sizeof(d.device_type) == sizeof(code));
  std::memcpy(&d.device_type, &code, sizeof code);
  d.device_id = index;
  return d;
}

TEST(DLPackDevice, RoundTripsEveryType) {
  for (const dlpack_type& t : dlpack_types) {
    for (int index : {0, 1, 5, 2147483647}) {
      const DLDevice dl = raw_dl_device(t.code, index);
      const device_id d = loom::from_dlpack(dl);
      EXPECT_EQ(static_cast<int>(d.type), t.code);
      EXPECT_EQ(d.index, index);
      const DLDevice back = loom::to_dlpack(d);
      EXPECT_EQ(static_cast<int>(back.device_type), t.code);
      EXPECT_EQ(back.device_id, index);
      EXPECT_EQ(loom::from_dlpack(back), d);
    }
  }
  for (device_type t : loom::all_device_types) {
    const device_id d{t, 4};
    EXPECT_EQ(loom::from_dlpack(loom::to_dlpack(d)), d);
  }
  const DLDevice cuda3 = loom::to_dlpack({device_type::cuda, 3});
  EXPECT_EQ(cuda3.device_type, kDLCUDA);
  EXPECT_EQ(cuda3.device_id, 3);
}

TEST(DLPackDevice, RejectsUndefinedTypesAndNegativeIndices) {
  for (std::int32_t code : {-1, 0, 5, 6, 14, 15, 16, 1000, -2147483647 - 1}) {
    const std::string message =
        invalid_argument_message([&] { (void)loom::from_dlpack(raw_dl_device(code, 0)); });
    EXPECT_NE(message.find("code " + std::to_string(code)), std::string::npos)
        << code << ": " << message;
  }
  const std::string message =
      invalid_argument_message([&] { (void)loom::from_dlpack(raw_dl_device(kDLCPU, -1)); });
  EXPECT_NE(message.find("negative device_id -1"), std::string::npos) << message;

  EXPECT_THROW((void)loom::to_dlpack({device_type::cpu, -1}), loom::invalid_argument);
  EXPECT_THROW((void)loom::to_dlpack({static_cast<device_type>(5), 0}), loom::invalid_argument);
}

}  // namespace
