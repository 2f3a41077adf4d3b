#include "ddp/comm/sharding/layout_tensors.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace ddp::comm {

namespace {

using layout::Layout;
using layout::Piece;

int64_t product(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

// The box [offset, offset + length) of `t`, a view.
at::Tensor box(at::Tensor t, const std::vector<int64_t>& offset,
               const std::vector<int64_t>& length) {
  for (size_t d = 0; d < offset.size(); ++d) {
    t = t.narrow(static_cast<int64_t>(d), offset[d], length[d]);
  }
  return t;
}

}  // namespace

void copy_piece(const Piece& piece, const at::Tensor& source, const at::Tensor& dest) {
  box(dest, piece.dest_offset, piece.length).copy_(box(source, piece.source_offset, piece.length));
}

at::Tensor take_local(const Layout& layout, const at::Tensor& whole,
                      const std::vector<int64_t>& coordinate) {
  TORCH_CHECK(whole.defined(), "ddp: take_local needs a defined whole tensor");
  TORCH_CHECK(whole.sizes().equals(layout.shape), "ddp: take_local: the whole tensor ",
              "has shape ", whole.sizes(), ", but the layout's shape is ",
              at::IntArrayRef(layout.shape), " (", layout::describe(layout),
              "); pass the whole tensor, not a local one");
  // Plain data out, as TensorParallel::local: a copy of a parameter is not part of its graph.
  at::NoGradGuard no_grad;
  at::Tensor local = at::empty(layout::local_shape(layout, coordinate), whole.options());
  // The whole tensor is the one holder of Layout::replicated: its pieces' source offsets are
  // global indices.
  for (const Piece& piece : layout::pieces(Layout::replicated(layout.shape), layout, coordinate)) {
    copy_piece(piece, whole, local);
  }
  return local;
}

at::Tensor gather_whole(const Layout& layout, const at::Tensor& local, ProcessGroup& group,
                        const std::string& what) {
  TORCH_CHECK(local.defined(), "ddp: gather_whole '", what, "' needs a defined local tensor");
  const int64_t ranks = product(layout.mesh);
  TORCH_CHECK(group.world_size() == ranks, "ddp: gather_whole '", what, "': the layout's mesh ",
              at::IntArrayRef(layout.mesh), " holds ", ranks, " ranks, but the process group has ",
              group.world_size(), " (", layout::describe(layout),
              "); the group's ranks must be the mesh's coordinates, row-major");
  std::vector<std::vector<int64_t>> shapes;  // every rank's local shape, by group rank
  for (int64_t r = 0; r < ranks; ++r) {
    shapes.push_back(layout::local_shape(layout, layout::coordinate_of(r, layout.mesh)));
  }
  TORCH_CHECK(local.sizes().equals(shapes[group.rank()]), "ddp: gather_whole '", what, "': rank ",
              group.rank(), " passed a local tensor of shape ", local.sizes(), ", but it holds ",
              at::IntArrayRef(shapes[group.rank()]), " at coordinate ",
              at::IntArrayRef(layout::coordinate_of(group.rank(), layout.mesh)), " (",
              layout::describe(layout), ")");
  at::NoGradGuard no_grad;
  // Replicated (no placement): every rank holds the whole tensor already, and every rank of the
  // group skips the collective alike (the layout is the same everywhere), so an export of a DDP
  // model is local, as rank 0 alone may ask it.
  if (ranks == 1 || layout.placements.empty()) return local.clone(at::MemoryFormat::Contiguous);

  // [Note: one all-gather per whole tensor]: every shard padded to the largest local numel.
  const int64_t chunk = product(layout::padded_local_shape(layout));
  at::Tensor shard = local.reshape({-1});
  if (shard.numel() != chunk) {
    at::Tensor padded = at::zeros({chunk}, local.options());
    padded.narrow(0, 0, shard.numel()).copy_(shard);
    shard = padded;
  }
  const at::Tensor gathered = group.all_gather(shard, ranks * chunk, what);

  at::Tensor whole = at::empty(layout.shape, local.options());
  for (const Piece& piece : layout::pieces(layout, Layout::replicated(layout.shape), {0})) {
    const int64_t r = layout::rank_of(piece.source, layout.mesh);
    const std::vector<int64_t>& shape = shapes[r];
    copy_piece(piece, gathered.narrow(0, r * chunk, product(shape)).view(shape), whole);
  }
  return whole;
}

at::Tensor gather_whole(const Layout& layout, const at::Tensor& local, const DeviceMesh& mesh,
                        const std::string& what) {
  TORCH_CHECK(layout.mesh == mesh.shape(), "ddp: gather_whole '", what, "': the layout's mesh ",
              at::IntArrayRef(layout.mesh), " differs from the DeviceMesh's shape ",
              at::IntArrayRef(mesh.shape()), " (", layout::describe(layout), ")");
  return gather_whole(layout, local, *mesh.parent(), what);
}

at::Tensor real_local(const layout::Layout& layout, const at::Tensor& stored,
                      const std::vector<int64_t>& coordinate, const std::string& what) {
  const std::vector<int64_t> real = layout::local_shape(layout, coordinate);
  bool fits = static_cast<int64_t>(real.size()) == stored.dim();
  for (size_t d = 0; fits && d < real.size(); ++d) fits = real[d] <= stored.size(d);
  TORCH_CHECK(fits, "ddp: ", what, " has shape ", stored.sizes(), " but its layout ",
              layout::describe(layout), " gives this rank ", at::IntArrayRef(real),
              " (call it between steps, when every parameter is its stored shard)");
  at::Tensor local = stored.detach();
  for (int64_t d = 0; d < local.dim(); ++d) local = local.narrow(d, 0, real[d]);
  return local;
}

at::Tensor padded_local(const layout::Layout& layout, const at::Tensor& local) {
  at::Tensor storage = at::zeros(layout::padded_local_shape(layout), local.options());
  at::Tensor target = storage;
  for (int64_t d = 0; d < local.dim(); ++d) target = target.narrow(d, 0, local.size(d));
  target.copy_(local);
  return storage;
}

}  // namespace ddp::comm
