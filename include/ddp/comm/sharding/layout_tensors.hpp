#pragma once
// Tensors over layouts: the two moves between a whole tensor and the local tensors a
// layout::Layout gives each mesh coordinate. layout/ says which elements a coordinate holds;
// this file moves them, with the one piece rule of layout::pieces, so a split that layout/ gets
// right is right here too.
//
// They replace the three ways whole parameters were assembled, each with its own row rule:
// a sharded module's own gather (FSDP's padded dim-0 shards), TensorParallel::full (packed q,k,v
// rows, column splits) and a sharded-only export (the whole checkpoint). A nested layout (TP,
// then FSDP over what TP left) had no way at all. The export of every style is now
// io::whole_state over these.
//
// [Note: one all-gather per whole tensor] gather_whole issues ONE all-gather over the mesh's
// parent group, not one per mesh dim: every rank pads its flat local tensor to the largest local
// numel (layout::padded_local_shape; coordinate 0 holds exactly that), so the flat all-gather
// takes the even path of [Note: flat collectives] (no copy out of a padded buffer) and one
// collective latency is paid however many mesh dims split the tensor. The cost is the padding on
// the wire, each split rounded up to whole chunks: what FSDP pads its shards with anyway.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ddp/comm/device_mesh.hpp"
#include "ddp/comm/process_group.hpp"
#include "ddp/layout/layout.hpp"

namespace ddp::comm {

// The local tensor `coordinate` holds under `layout` (shape layout::local_shape, possibly with
// zero-size dims), copied out of `whole` (shape layout.shape, else c10::Error naming both): new,
// contiguous, `whole`'s dtype and device, no autograd history. No communication: every rank of
// a checkpoint load or a plan's start slices the same whole tensor.
at::Tensor take_local(const layout::Layout& layout, const at::Tensor& whole,
                      const std::vector<int64_t>& coordinate);

// Copies box `piece` (layout::pieces) of `source`, a holder's local tensor, into `dest`, the
// wanted local tensor (its storage, padded or not): the one piece copy of take_local, gather_whole
// and the checkpoint loads.
void copy_piece(const layout::Piece& piece, const at::Tensor& source, const at::Tensor& dest);

// The real part of what `coordinate` stores under `layout`: `stored` (the padded storage every
// coordinate has, layout::padded_local_shape, or already the real local tensor) narrowed to
// layout::local_shape from the start of each dim, a view. Throws naming `what`, the shapes and
// the layout when `stored` is smaller than that (e.g. a sharded parameter caught mid-step).
at::Tensor real_local(const layout::Layout& layout, const at::Tensor& stored,
                      const std::vector<int64_t>& coordinate, const std::string& what);
// The inverse: `local` (this coordinate's real local tensor) at the start of each dim of new
// zeros of layout::padded_local_shape, the storage every coordinate has.
at::Tensor padded_local(const layout::Layout& layout, const at::Tensor& local);

// The whole tensor (shape layout.shape; new, contiguous, `local`'s dtype and device, no autograd
// history) from every rank's local tensor. Collective over `group`, whose rank r is the mesh
// coordinate layout::coordinate_of(r, layout.mesh) (row-major, as DeviceMesh): group.world_size()
// must equal the mesh's product, and `local` must have this rank's layout::local_shape. Replicated
// mesh dims are read at coordinate 0 (the replicas are assumed equal). One all-gather: [Note: one
// all-gather per whole tensor]; a group of one rank, or a layout without placements (replicated:
// `local` is already whole), copies `local` without communicating. `what` names the collective in
// errors.
at::Tensor gather_whole(const layout::Layout& layout, const at::Tensor& local, ProcessGroup& group,
                        const std::string& what);

// The same over the mesh's parent group; layout.mesh must equal mesh.shape() (else c10::Error
// naming both), so that the layout's coordinates are the mesh's.
at::Tensor gather_whole(const layout::Layout& layout, const at::Tensor& local,
                        const DeviceMesh& mesh, const std::string& what);

}  // namespace ddp::comm
