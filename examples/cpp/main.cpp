// Runs the torchops ops from C++, without Python, three ways, on the inputs export_and_check.py saved:
//   (a) an AOTInductor package (torch::inductor::AOTIModelPackageLoader),
//   (b) a TorchScript module (torch::jit::load),
//   (c) direct calls through <torchops/ops.h>, plus one bad input whose c10::Error message is recorded.
// The outputs go to <dir>/outputs_<device>.pt (torch.load-able) for export_and_check.py to compare with Python.
//
//   torchops_example <dir> <device: cpu|cuda>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/script.h>
#include <torchops/ops.h>

#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

namespace {

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<at::Tensor> tensors(const c10::IValue& list, const torch::Device& device) {
  std::vector<at::Tensor> out;
  for (const c10::IValue& value : list.toListRef()) out.push_back(value.toTensor().to(device));
  return out;
}

// Fresh copies for each run: the model writes one of its inputs (vector_add_out's out).
std::vector<at::Tensor> copies(const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : inputs) out.push_back(t.clone());
  return out;
}

c10::List<at::Tensor> to_cpu(const std::vector<at::Tensor>& outputs) {
  c10::List<at::Tensor> out;
  for (const at::Tensor& t : outputs) out.push_back(t.cpu());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: " << argv[0] << " <dir written by export_and_check.py> <cpu|cuda>\n";
    return 2;
  }
  const std::string dir = argv[1];
  const std::string device_name = argv[2];
  const torch::Device device(device_name);
  c10::InferenceMode no_autograd;  // a server's setting; the ops' Autograd kernels are skipped

  // {"args": [the model's inputs], "bad": [two tensors vector_add must refuse]}
  const c10::IValue saved = torch::jit::pickle_load(read_file(dir + "/inputs.pt"));
  const c10::Dict<c10::IValue, c10::IValue> inputs = saved.toGenericDict();
  const std::vector<at::Tensor> args = tensors(inputs.at("args"), device);
  const std::vector<at::Tensor> bad = tensors(inputs.at("bad"), device);
  c10::impl::GenericDict results(c10::StringType::get(), c10::AnyType::get());

  // (a) AOTInductor: the package's compiled model calls the myns ops through the dispatcher.
  torch::inductor::AOTIModelPackageLoader loader(dir + "/model_" + device_name + ".pt2");
  results.insert("aoti", to_cpu(loader.run(copies(args))));

  // (b) TorchScript.
  torch::jit::Module scripted = torch::jit::load(dir + "/scripted.pt", device);
  const std::vector<at::Tensor> script_args = copies(args);
  const c10::IValue script_out = scripted.forward(std::vector<c10::IValue>(script_args.begin(), script_args.end()));
  std::vector<at::Tensor> script_results;
  for (const c10::IValue& value : script_out.toTupleRef().elements()) script_results.push_back(value.toTensor());
  results.insert("torchscript", to_cpu(script_results));

  // (c) The public header, the same calls as the model's forward (export_and_check.py: AllOps).
  const std::vector<at::Tensor> a = copies(args);
  const at::Tensor out = a[2];
  torchops::vector_add_out(a[0], a[1], out);
  const auto [normed, residual_out] = torchops::add_rms_norm(a[11], a[12], a[10], 1e-6, 1.0);
  results.insert("direct", to_cpu({torchops::vector_add(a[0], a[1]), out, torchops::swiglu(a[3], a[4]),
                                   torchops::csr_spmm(a[5], a[6], a[7], a[8]), torchops::rms_norm(a[9], a[10]),
                                   normed, residual_out}));

  // Bad input surfaces as c10::Error whose message is Python's RuntimeError text.
  std::string error = "no error";
  try {
    torchops::vector_add(bad[0], bad[1]);
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  }
  results.insert("error", error);

  const std::vector<char> bytes = torch::jit::pickle_save(results);
  const std::string path = dir + "/outputs_" + device_name + ".pt";
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  std::cout << "torchops_example (" << device_name << "): aoti, torchscript, direct and error outputs in " << path
            << "\n  error: " << error << "\n";
  return 0;
}
