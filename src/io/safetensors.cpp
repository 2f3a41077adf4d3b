#include "ddp/io/safetensors.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include "c10_errors.hpp"
#include "ddp/files/posix_file.hpp"

// The data buffer is little-endian and is copied into (and out of) tensor memory as it is.
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ddp/io/safetensors: only little-endian hosts are supported (the format is little-endian)"
#endif

namespace ddp::io {
namespace {

using json = nlohmann::json;

// The reference implementation refuses headers above 100 MB (MAX_HEADER_SIZE): a bound that keeps
// a corrupt length from allocating the whole file as a string.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

struct DtypeInfo {
  const char* name;
  at::ScalarType type;
  uint64_t bytes;
};

constexpr DtypeInfo kDtypes[] = {
    {"F64", at::kDouble, 8},    {"F32", at::kFloat, 4}, {"F16", at::kHalf, 2},
    {"BF16", at::kBFloat16, 2}, {"I64", at::kLong, 8},  {"I32", at::kInt, 4},
    {"I16", at::kShort, 2},     {"I8", at::kChar, 1},   {"U8", at::kByte, 1},
    {"BOOL", at::kBool, 1},
};

std::string supported_dtypes() {
  std::string out;
  for (const DtypeInfo& d : kDtypes) out += (out.empty() ? "" : " ") + std::string(d.name);
  return out;
}

const DtypeInfo* dtype_by_name(const std::string& name) {
  for (const DtypeInfo& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

const DtypeInfo* dtype_by_type(at::ScalarType type) {
  for (const DtypeInfo& d : kDtypes)
    if (type == d.type) return &d;
  return nullptr;
}

// One tensor of the header, checked: dtype known, shape non-negative, region of the right size.
struct Entry {
  std::string name;
  const DtypeInfo* dtype = nullptr;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // [begin, end) within the data buffer
};

// The checked header of a file. Invariant: the entries' regions tile [0, buffer_bytes) exactly.
struct Header {
  std::vector<Entry> entries;  // in name order
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;    // file offset of the data buffer: 8 + N
  uint64_t buffer_bytes = 0;  // file size - data_start
};

std::string prefix(const std::string& path) { return "ddp: safetensors file '" + path + "': "; }

// Shapes from the header are untrusted: numel * element size must not wrap around.
bool checked_mul(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

Entry parse_entry(const std::string& path, const std::string& name, const json& value,
                  uint64_t buffer_bytes) {
  const std::string p = prefix(path) + "tensor '" + name + "': ";
  TORCH_CHECK(value.is_object(), p, "header entry is not an object but ", value.type_name(),
              " (expected {\"dtype\", \"shape\", \"data_offsets\"})");
  Entry e;
  e.name = name;

  const auto dtype_it = value.find("dtype");
  TORCH_CHECK(dtype_it != value.end() && dtype_it->is_string(), p,
              "\"dtype\" is missing or not a string");
  const std::string dtype = dtype_it->get<std::string>();
  e.dtype = dtype_by_name(dtype);
  TORCH_CHECK(e.dtype != nullptr, p, "unknown dtype '", dtype, "' (supported: ", supported_dtypes(),
              ")");

  const auto shape_it = value.find("shape");
  TORCH_CHECK(shape_it != value.end() && shape_it->is_array(), p,
              "\"shape\" is missing or not a list (expected a list of non-negative integers)");
  uint64_t numel = 1;
  for (const json& dim : *shape_it) {
    TORCH_CHECK(dim.is_number_unsigned() &&
                    dim.get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max()),
                p, "shape ", shape_it->dump(), " is not a list of non-negative integers");
    const uint64_t d = dim.get<uint64_t>();
    TORCH_CHECK(checked_mul(numel, d, &numel), p, "shape ", shape_it->dump(),
                " has more elements than fit in 64 bits");
    e.shape.push_back(int64_t(d));
  }
  uint64_t nbytes = 0;
  TORCH_CHECK(checked_mul(numel, e.dtype->bytes, &nbytes), p, "shape ", shape_it->dump(),
              " has more bytes than fit in 64 bits");

  const auto off_it = value.find("data_offsets");
  TORCH_CHECK(off_it != value.end() && off_it->is_array() && off_it->size() == 2 &&
                  (*off_it)[0].is_number_unsigned() && (*off_it)[1].is_number_unsigned(),
              p, "\"data_offsets\" must be [begin, end] with non-negative integers, got ",
              off_it == value.end() ? std::string("nothing") : off_it->dump());
  e.begin = (*off_it)[0].get<uint64_t>();
  e.end = (*off_it)[1].get<uint64_t>();
  TORCH_CHECK(e.begin <= e.end && e.end <= buffer_bytes, p, "data_offsets [", e.begin, ", ", e.end,
              "] are not within the data buffer of ", buffer_bytes, " bytes");
  TORCH_CHECK(e.end - e.begin == nbytes, p, "data_offsets [", e.begin, ", ", e.end, "] hold ",
              e.end - e.begin, " bytes but shape ", shape_it->dump(), " of ", dtype, " needs ",
              nbytes, " bytes (", numel, " elements x ", e.dtype->bytes, ")");
  return e;
}

// Reads the first 8 + N bytes and checks the whole header against the file's size.
Header read_header(const std::string& path, std::ifstream& in) {
  in.open(path, std::ios::binary);
  TORCH_CHECK(in.is_open(), prefix(path), "cannot open for reading: ", std::strerror(errno));
  std::error_code ec;
  const uint64_t file_bytes = std::filesystem::file_size(path, ec);
  TORCH_CHECK(!ec, prefix(path), "cannot read its size: ", ec.message());
  TORCH_CHECK(file_bytes >= 8, prefix(path), "file is shorter than 8 bytes (", file_bytes,
              " bytes): no header length, not a safetensors file");

  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  TORCH_CHECK(in, prefix(path), "cannot read the header length");
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | len_bytes[i];
  TORCH_CHECK(header_bytes <= file_bytes - 8, prefix(path), "header length ", header_bytes,
              " is beyond the file (", file_bytes - 8, " bytes after the length)");
  TORCH_CHECK(header_bytes <= kMaxHeaderBytes, prefix(path), "header length ", header_bytes,
              " is above the format's limit of ", kMaxHeaderBytes, " bytes");

  std::string text(header_bytes, '\0');
  in.read(text.data(), std::streamsize(header_bytes));
  TORCH_CHECK(in, prefix(path), "cannot read the ", header_bytes, "-byte header");

  // nlohmann keeps the last of two equal keys; the callback sees every top-level key first.
  std::set<std::string> seen;
  std::string duplicate;
  const json::parser_callback_t note_keys = [&](int depth, json::parse_event_t event,
                                                json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && duplicate.empty() &&
        !seen.insert(parsed.get<std::string>()).second)
      duplicate = parsed.get<std::string>();
    return true;
  };
  json header;
  try {
    header = json::parse(text, note_keys);
  } catch (const json::parse_error& err) {
    TORCH_CHECK(false, prefix(path), "header is not valid JSON: ", err.what());
  }
  TORCH_CHECK(header.is_object(), prefix(path), "header is not a JSON object but ",
              header.type_name());
  TORCH_CHECK(duplicate.empty(), prefix(path), "duplicate name '", duplicate, "' in the header");

  Header h;
  h.data_start = 8 + header_bytes;
  h.buffer_bytes = file_bytes - h.data_start;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      TORCH_CHECK(value.is_object(), prefix(path), "\"__metadata__\" is not an object but ",
                  value.type_name());
      for (const auto& [key, text_value] : value.items()) {
        TORCH_CHECK(text_value.is_string(), prefix(path), "\"__metadata__\" value of '", key,
                    "' is not a string but ", text_value.type_name());
        h.metadata[key] = text_value.get<std::string>();
      }
      continue;
    }
    h.entries.push_back(parse_entry(path, name, value, h.buffer_bytes));
  }

  // The spec requires the regions to cover the buffer exactly, in some order, without overlap.
  std::vector<const Entry*> by_offset;
  for (const Entry& e : h.entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return std::tie(a->begin, a->end) < std::tie(b->begin, b->end);
  });
  uint64_t covered = 0;
  const Entry* last = nullptr;
  for (const Entry* e : by_offset) {
    TORCH_CHECK(e->begin >= covered, prefix(path), "tensor '", e->name, "' at [", e->begin, ", ",
                e->end, "] overlaps tensor '", last ? last->name : "", "' at [",
                last ? last->begin : 0, ", ", covered, "]");
    TORCH_CHECK(e->begin == covered, prefix(path), "bytes [", covered, ", ", e->begin,
                ") of the data buffer belong to no tensor (gap before tensor '", e->name, "')");
    covered = e->end;
    last = e;
  }
  TORCH_CHECK(covered == h.buffer_bytes, prefix(path), "file holds ", h.buffer_bytes - covered,
              " trailing bytes after the tensors' data (data ends at buffer byte ", covered,
              ", the buffer has ", h.buffer_bytes, ")");
  return h;
}

}  // namespace

TensorMap load_safetensors(const std::string& path) {
  std::ifstream in;
  const Header h = read_header(path, in);
  TensorMap out;
  for (const Entry& e : h.entries) {
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype->type));
    const uint64_t nbytes = e.end - e.begin;
    if (nbytes > 0) {
      in.seekg(std::streamoff(h.data_start + e.begin));
      in.read(static_cast<char*>(t.data_ptr()), std::streamsize(nbytes));
      TORCH_CHECK(in, prefix(path), "tensor '", e.name, "': cannot read its ", nbytes, " bytes");
    }
    if (e.dtype->type == at::kBool) {
      // A bool byte other than 0 or 1 is undefined behaviour for torch: refuse it here.
      const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
      for (uint64_t i = 0; i < nbytes; ++i)
        TORCH_CHECK(bytes[i] <= 1, prefix(path), "tensor '", e.name, "' (BOOL) holds byte ",
                    int(bytes[i]), " at element ", i, "; BOOL elements must be 0 or 1");
    }
    out.emplace(e.name, std::move(t));
  }
  return out;
}

std::map<std::string, std::string> load_safetensors_metadata(const std::string& path) {
  std::ifstream in;
  return read_header(path, in).metadata;
}

void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Header as the reference writes it: compact JSON, "__metadata__" first, then each tensor's
  // dtype, shape and data_offsets. The reference orders the data by dtype size so every tensor is
  // aligned for zero-copy loads; we order by name (one map, one byte stream) and load by copy.
  std::vector<at::Tensor> data;
  std::string header = "{";
  if (!metadata.empty()) header += json(kMetadataKey).dump() + ":" + json(metadata).dump();
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    TORCH_CHECK(name != kMetadataKey, "ddp: safetensors: '", path, "': a tensor cannot be named ",
                kMetadataKey, " (the name is reserved for the metadata)");
    TORCH_CHECK(tensor.defined(), "ddp: safetensors: '", path, "': tensor '", name,
                "' is undefined");
    TORCH_CHECK(tensor.layout() == at::kStrided, "ddp: safetensors: '", path, "': tensor '", name,
                "' has layout ", tensor.layout(), "; safetensors holds dense tensors only");
    const DtypeInfo* dtype = dtype_by_type(tensor.scalar_type());
    TORCH_CHECK(dtype != nullptr, "ddp: safetensors: '", path, "': tensor '", name, "' has dtype ",
                tensor.scalar_type(), ", not one of ", supported_dtypes());
    at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
    const uint64_t nbytes = uint64_t(t.numel()) * dtype->bytes;
    json shape = json::array();
    for (int64_t d : t.sizes()) shape.push_back(d);
    if (header.size() > 1) header += ",";
    header += json(name).dump() + ":{\"dtype\":\"" + dtype->name + "\",\"shape\":" + shape.dump() +
              ",\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + nbytes) + "]}";
    offset += nbytes;
    data.push_back(std::move(t));
  }
  header += "}";
  // Spaces up to a multiple of 8, as the reference pads, so the data buffer starts 8-aligned.
  header.append((8 - header.size() % 8) % 8, ' ');

  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = (uint64_t(header.size()) >> (8 * i)) & 0xff;

  // Atomic (posix_file.hpp): a failed write leaves the file that was at `path` untouched.
  as_c10_error([&] {
    files::AtomicFile file(path);
    file.write(len_bytes, 8);
    file.write(header.data(), header.size());
    for (const at::Tensor& t : data)
      if (t.numel() > 0) file.write(t.data_ptr(), t.nbytes());
    file.commit();
  });
}

}  // namespace ddp::io
