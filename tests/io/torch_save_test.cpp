#include "ddp/io/torch_save.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <unistd.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "support/error_text.hpp"
#include "support/pytorch_required.hpp"
#include "support/run_command.hpp"
#include "support/temp_dir.hpp"

namespace {

using ddp::testing::error_of;
using ddp::testing::TempDir;

namespace fs = std::filesystem;
using ddp::io::TensorMap;

// Whether /usr/bin/python3 can import torch (Debian's python3-torch); the interop tests need it.
// Runs a Python program (written to a file in `dir`, so no shell quoting) and returns its output.
std::pair<std::string, int> python(const TempDir& dir, const std::string& program) {
  const std::string script = dir.file("script.py");
  std::ofstream(script) << program;
  return ddp::testing::run_command("/usr/bin/python3 " + script);
}

// Values every dtype holds exactly; a transposed view so that saving must materialize it.
TensorMap sample_tensors() {
  return {
      {"fc.weight", at::arange(6, at::kFloat).reshape({2, 3}) * 0.5},
      {"fc.bias", at::tensor({-1.5, 2.25}, at::kDouble)},
      {"half", at::arange(4, at::kHalf)},
      {"bf16", at::arange(4, at::kBFloat16) - 2},
      {"count", at::scalar_tensor(int64_t{7}, at::kLong)},
      {"mask", at::tensor({1, 0, 1}, at::kInt).to(at::kBool)},
      {"transposed", at::arange(6, at::kFloat).reshape({2, 3}).t()},
      {"empty", at::zeros({0, 4}, at::kFloat)},
  };
}

void expect_same(const TensorMap& got, const TensorMap& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_EQ(got.count(name), 1u) << name;
    EXPECT_EQ(got.at(name).scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(got.at(name).sizes(), t.sizes()) << name;
    EXPECT_TRUE(at::equal(got.at(name), t)) << name << ": " << got.at(name) << " vs " << t;
  }
}

TEST(TorchSave, RoundTripsInCpp) {
  TempDir dir;
  ddp::io::save_torch(dir.file("w.pt"), sample_tensors());
  expect_same(ddp::io::load_torch(dir.file("w.pt")), sample_tensors());
}

TEST(TorchSave, ExtensionPicksTheFormat) {
  TempDir dir;
  for (const std::string name : {"w.pt", "w.pth", "w.safetensors", "w.bin"}) {
    ddp::io::save_weights(dir.file(name), sample_tensors());
    const std::string bytes = ddp::testing::read_file(dir.file(name));
    EXPECT_EQ(bytes.substr(0, 2) == "PK", ddp::io::is_torch_save_path(name)) << name;
    expect_same(ddp::io::load_weights(dir.file(name)), sample_tensors());
  }
}

TEST(TorchSave, PythonTorchLoadReadsOurs) {
  DDP_REQUIRE_PYTORCH(ddp::testing::python_has_torch(),
                      "/usr/bin/python3 has no torch (python3-torch)");
  TempDir dir;
  ddp::io::save_torch(dir.file("ours.pt"), sample_tensors());
  const auto [out, code] = python(dir, R"(
import torch
d = torch.load(')" + dir.file("ours.pt") + R"(')
assert type(d) is dict, type(d)
assert sorted(d) == ['bf16', 'count', 'empty', 'fc.bias', 'fc.weight', 'half', 'mask', 'transposed'], sorted(d)
assert torch.equal(d['fc.weight'], torch.arange(6.).reshape(2, 3) * 0.5)
assert d['fc.bias'].dtype == torch.float64 and d['fc.bias'].tolist() == [-1.5, 2.25]
assert d['half'].dtype == torch.float16 and d['half'].tolist() == [0, 1, 2, 3]
assert d['bf16'].dtype == torch.bfloat16 and d['bf16'].tolist() == [-2, -1, 0, 1]
assert d['count'].dtype == torch.int64 and d['count'].shape == () and d['count'].item() == 7
assert d['mask'].tolist() == [True, False, True]
assert torch.equal(d['transposed'], torch.arange(6.).reshape(2, 3).t())
assert d['empty'].shape == (0, 4)
print('python read ok')
)");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("python read ok"), std::string::npos) << out;
}

TEST(TorchSave, WeLoadPythonTorchSave) {
  DDP_REQUIRE_PYTORCH(ddp::testing::python_has_torch(),
                      "/usr/bin/python3 has no torch (python3-torch)");
  TempDir dir;
  const auto [out, code] = python(dir, R"(
import torch
lin = torch.nn.Linear(3, 2)
with torch.no_grad():
    lin.weight.copy_(torch.arange(6.).reshape(2, 3))
    lin.bias.copy_(torch.tensor([0.5, -0.5]))
torch.save({'x': torch.arange(5.), 'y.z': torch.zeros(2, 2, dtype=torch.int64),
            'strided': torch.arange(10.)[::2], 'h': torch.ones(3, dtype=torch.float16)},
           ')" + dir.file("plain.pt") + R"(')
torch.save(lin.state_dict(), ')" + dir.file("state_dict.pt") +
                                           R"(')
torch.save(dict(lin.state_dict()), ')" + dir.file("state_dict_as_dict.pt") +
                                           R"(')
torch.save({'x': torch.ones(2)}, ')" + dir.file("legacy.pt") +
                                           R"(', _use_new_zipfile_serialization=False)
print('python wrote ok')
)");
  ASSERT_EQ(code, 0) << out;

  const TensorMap plain = ddp::io::load_torch(dir.file("plain.pt"));
  expect_same(plain, {{"x", at::arange(5, at::kFloat)},
                      {"y.z", at::zeros({2, 2}, at::kLong)},
                      {"strided", at::arange(0, 10, 2, at::kFloat)},
                      {"h", at::ones({3}, at::kHalf)}});
  expect_same(
      ddp::io::load_torch(dir.file("state_dict_as_dict.pt")),
      {{"weight", at::arange(6, at::kFloat).reshape({2, 3})}, {"bias", at::tensor({0.5f, -0.5f})}});
  // What libtorch's unpickler cannot read is refused with what to do instead.
  const std::string refused = error_of([&] { ddp::io::load_torch(dir.file("state_dict.pt")); });
  EXPECT_EQ(refused.rfind("ddp: torch.save file '" + dir.file("state_dict.pt") +
                              "': libtorch cannot unpickle it (",
                          0),
            0u)
      << refused;
  EXPECT_NE(refused.find("from Python, save {k: v.detach() for k, v in "
                         "model.state_dict().items()} rather than model.state_dict() itself"),
            std::string::npos)
      << refused;
  EXPECT_NE(error_of([&] {
              ddp::io::load_torch(dir.file("legacy.pt"));
            }).find("': not a zip archive, so not torch.save's format"),
            std::string::npos);
}

}  // namespace
