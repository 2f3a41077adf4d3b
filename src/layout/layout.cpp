#include "ddp/layout/layout.hpp"

#include "ddp/layout/even_split.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <optional>
#include <sstream>

#include "ddp/detail/join.hpp"

namespace ddp::layout {

using detail::join;

namespace {

std::string bracketed(const std::vector<int64_t>& values) { return "[" + join(values) + "]"; }

std::string describe(const Placement& p) {
  std::ostringstream out;
  if (p.kind == Placement::Kind::kReplicate) {
    out << "Replicate";
  } else {
    out << "Shard(" << p.dim;
    if (p.packed != 1) out << ", packed " << p.packed;
    out << ")";
  }
  out << " over mesh dim " << p.mesh_dim;
  return out.str();
}

int64_t product(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

void check_mesh(const std::vector<int64_t>& mesh, const char* who) {
  for (size_t m = 0; m < mesh.size(); ++m) {
    TORCH_CHECK(mesh[m] >= 1, "ddp: ", who, ": mesh [", join(mesh), "] has size ", mesh[m],
                " on mesh dim ", m, "; every mesh dim needs at least 1 rank");
  }
}

// Everything validate() checks that does not depend on a coordinate.
void check_static(const Layout& layout) {
  const std::string what = "ddp: layout " + describe(layout) + ": ";
  TORCH_CHECK(!layout.mesh.empty(), what, "the mesh has no dims; one rank is mesh [1]");
  check_mesh(layout.mesh, "layout");
  for (size_t d = 0; d < layout.shape.size(); ++d) {
    TORCH_CHECK(layout.shape[d] >= 0, what, "tensor dim ", d, " has negative size ",
                layout.shape[d]);
  }
  const int mesh_dims = static_cast<int>(layout.mesh.size());
  std::vector<int> listed_at(layout.mesh.size(), -1);  // placement index per mesh dim, -1: none
  for (size_t i = 0; i < layout.placements.size(); ++i) {
    const Placement& p = layout.placements[i];
    const std::string which = "placement " + std::to_string(i) + " (" + describe(p) + ")";
    TORCH_CHECK(p.mesh_dim >= 0 && p.mesh_dim < mesh_dims, what, which, " names mesh dim ",
                p.mesh_dim, ", but the mesh has ", mesh_dims, " dims");
    // Two splits over one mesh dim would give a rank two coordinates on it.
    TORCH_CHECK(listed_at[p.mesh_dim] < 0, what, "mesh dim ", p.mesh_dim,
                " is listed twice (placements ", listed_at[p.mesh_dim], " and ", i,
                "); each mesh dim splits the tensor at most once");
    listed_at[p.mesh_dim] = static_cast<int>(i);
    if (p.kind != Placement::Kind::kShard) continue;
    TORCH_CHECK(p.dim >= 0 && p.dim < static_cast<int64_t>(layout.shape.size()), what, which,
                " shards tensor dim ", p.dim, ", but the tensor has ", layout.shape.size(),
                " dims");
    TORCH_CHECK(p.packed >= 1, what, which, " has packed ", p.packed,
                "; packed counts equal blocks side by side, at least 1");
  }
}

void check_coordinate(const Layout& layout, const std::vector<int64_t>& coordinate) {
  bool inside = coordinate.size() == layout.mesh.size();
  for (size_t m = 0; inside && m < coordinate.size(); ++m) {
    inside = coordinate[m] >= 0 && coordinate[m] < layout.mesh[m];
  }
  TORCH_CHECK(inside, "ddp: coordinate [", join(coordinate), "] is not in the mesh of layout ",
              describe(layout));
}

// Appends `piece` to a dim's interval list: empty intervals are dropped and touching ones
// merged, so equal holdings have equal lists.
void append(std::vector<Interval>& list, Interval piece) {
  if (piece.size() <= 0) return;
  if (!list.empty() && list.back().end == piece.begin) {
    list.back().end = piece.end;
  } else {
    list.push_back(piece);
  }
}

// Local elements [begin, end) of the local tensor laid out by `list`, as global intervals.
void append_local_range(const std::vector<Interval>& list, int64_t begin, int64_t end,
                        std::vector<Interval>& out) {
  int64_t local = 0;  // where the current interval starts in the local tensor
  for (const Interval& iv : list) {
    const int64_t lo = std::max(begin, local);
    const int64_t hi = std::min(end, local + iv.size());
    if (lo < hi) append(out, {iv.begin + lo - local, iv.begin + hi - local});
    local += iv.size();
  }
}

int64_t total(const std::vector<Interval>& list) {
  int64_t n = 0;
  for (const Interval& iv : list) n += iv.size();
  return n;
}

// held() for a layout that passed check_static and a coordinate inside its mesh.
Held hold(const Layout& layout, const std::vector<int64_t>& coordinate) {
  Held h;
  h.dims.resize(layout.shape.size());
  for (size_t d = 0; d < layout.shape.size(); ++d) append(h.dims[d], {0, layout.shape[d]});
  for (size_t i = 0; i < layout.placements.size(); ++i) {
    const Placement& p = layout.placements[i];
    if (p.kind != Placement::Kind::kShard) continue;
    std::vector<Interval>& list = h.dims[p.dim];
    const int64_t extent = total(list);
    TORCH_CHECK(extent % p.packed == 0, "ddp: layout ", describe(layout), ": placement ", i, " (",
                describe(p), ") splits tensor dim ", p.dim, " into ", p.packed,
                " equal blocks, but coordinate [", join(coordinate), "] holds ", extent,
                " elements there, not a multiple of ", p.packed);
    // [Note: the even split rule] (even_split.hpp), applied to each packed block.
    const int64_t block = extent / p.packed;
    const EvenSplit split_of_block{block, layout.mesh[p.mesh_dim]};
    const int64_t begin = split_of_block.offset(coordinate[p.mesh_dim]);
    const int64_t end = begin + split_of_block.length(coordinate[p.mesh_dim]);
    std::vector<Interval> split;
    for (int64_t b = 0; b < p.packed; ++b) {
      append_local_range(list, b * block + begin, b * block + end, split);
    }
    list = std::move(split);
  }
  return h;
}

// A run of one tensor dim that a holder and the wanted coordinate share, in local indices.
struct Segment {
  int64_t source = 0;
  int64_t dest = 0;
  int64_t length = 0;
};

// The runs of one dim the saved holder's `have` shares with `want`, in the wanted tensor's
// order; runs contiguous in both local tensors are merged so that copies stay large.
std::vector<Segment> shared_runs(const std::vector<Interval>& have,
                                 const std::vector<Interval>& want) {
  std::vector<Segment> runs;
  int64_t dest = 0;
  for (const Interval& w : want) {
    int64_t source = 0;
    for (const Interval& s : have) {
      const int64_t lo = std::max(s.begin, w.begin);
      const int64_t hi = std::min(s.end, w.end);
      if (lo < hi) runs.push_back({source + lo - s.begin, dest + lo - w.begin, hi - lo});
      source += s.size();
    }
    dest += w.size();
  }
  std::sort(runs.begin(), runs.end(),
            [](const Segment& a, const Segment& b) { return a.dest < b.dest; });
  std::vector<Segment> merged;
  for (const Segment& r : runs) {
    if (!merged.empty() && merged.back().source + merged.back().length == r.source &&
        merged.back().dest + merged.back().length == r.dest) {
      merged.back().length += r.length;
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

// The row-major first local index of `extents` that no piece covers, if any. Below dim d only
// the pieces containing `prefix` matter; the first uncovered index there is 0 or the end of one
// of them (covered at x - 1 and not at x means a piece ends at x), so only those are tried.
std::optional<std::vector<int64_t>> first_uncovered(const std::vector<Piece>& all,
                                                    const std::vector<size_t>& active,
                                                    const std::vector<int64_t>& extents,
                                                    std::vector<int64_t>& prefix) {
  const size_t d = prefix.size();
  if (d == extents.size()) {
    return active.empty() ? std::optional<std::vector<int64_t>>(prefix) : std::nullopt;
  }
  std::vector<int64_t> tries{0};
  for (size_t i : active) tries.push_back(all[i].dest_offset[d] + all[i].length[d]);
  std::sort(tries.begin(), tries.end());
  tries.erase(std::unique(tries.begin(), tries.end()), tries.end());
  for (int64_t x : tries) {
    if (x >= extents[d]) break;
    std::vector<size_t> inside;
    for (size_t i : active) {
      if (all[i].dest_offset[d] <= x && x < all[i].dest_offset[d] + all[i].length[d]) {
        inside.push_back(i);
      }
    }
    prefix.push_back(x);
    auto found = first_uncovered(all, inside, extents, prefix);
    prefix.pop_back();
    if (found) return found;
  }
  return std::nullopt;
}

// The global index of local element `local` of the local tensor laid out by `list`.
int64_t global_of(const std::vector<Interval>& list, int64_t local) {
  for (const Interval& iv : list) {
    if (local < iv.size()) return iv.begin + local;
    local -= iv.size();
  }
  return -1;  // not reached: callers pass a local index inside the list
}

}  // namespace

std::vector<int64_t> coordinate_of(int64_t rank, const std::vector<int64_t>& mesh) {
  check_mesh(mesh, "coordinate_of");
  TORCH_CHECK(rank >= 0 && rank < product(mesh), "ddp: coordinate_of: rank ", rank,
              " is outside mesh [", join(mesh), "] of ", product(mesh), " ranks");
  std::vector<int64_t> coordinate(mesh.size());
  for (size_t m = mesh.size(); m-- > 0;) {
    coordinate[m] = rank % mesh[m];
    rank /= mesh[m];
  }
  return coordinate;
}

int64_t rank_of(const std::vector<int64_t>& coordinate, const std::vector<int64_t>& mesh) {
  check_mesh(mesh, "rank_of");
  int64_t rank = 0;
  bool inside = coordinate.size() == mesh.size();
  for (size_t m = 0; inside && m < mesh.size(); ++m) {
    inside = coordinate[m] >= 0 && coordinate[m] < mesh[m];
    rank = rank * mesh[m] + coordinate[m];
  }
  TORCH_CHECK(inside, "ddp: rank_of: coordinate [", join(coordinate), "] is outside mesh [",
              join(mesh), "]");
  return rank;
}

Placement Placement::replicate(int mesh_dim) {
  Placement p;
  p.mesh_dim = mesh_dim;
  p.kind = Kind::kReplicate;
  return p;
}

Placement Placement::shard(int mesh_dim, int64_t dim, int64_t packed) {
  Placement p;
  p.mesh_dim = mesh_dim;
  p.kind = Kind::kShard;
  p.dim = dim;
  p.packed = packed;
  return p;
}

bool Placement::operator==(const Placement& other) const {
  if (mesh_dim != other.mesh_dim || kind != other.kind) return false;
  return kind == Kind::kReplicate || (dim == other.dim && packed == other.packed);
}

Layout Layout::replicated(std::vector<int64_t> shape) {
  Layout layout;
  layout.shape = std::move(shape);
  layout.mesh = {1};
  return layout;
}

Layout nest(const Layout& inner, const Layout& outer) {
  validate(inner);
  validate(outer);
  const std::vector<int64_t> local = padded_local_shape(inner);
  TORCH_CHECK(outer.shape == local, "ddp: layout nest: the outer layout is over shape ",
              bracketed(outer.shape), " but the inner layout (", describe(inner),
              ") leaves local tensors of ", bracketed(local));
  // Every inner coordinate must hold that much: an outer split of a shorter local tensor would
  // not be the split the outer runtime applied.
  int64_t count = 1;
  for (int64_t m : inner.mesh) count *= m;
  for (int64_t r = 0; r < count; ++r) {
    TORCH_CHECK(local_shape(inner, coordinate_of(r, inner.mesh)) == local,
                "ddp: layout nest: inner coordinate ", bracketed(coordinate_of(r, inner.mesh)),
                " holds ", bracketed(local_shape(inner, coordinate_of(r, inner.mesh))),
                ", not the ", bracketed(local), " the outer layout splits (", describe(inner), ")");
  }
  Layout out;
  out.shape = inner.shape;
  out.mesh = outer.mesh;
  out.mesh.insert(out.mesh.end(), inner.mesh.begin(), inner.mesh.end());
  const int shift = static_cast<int>(outer.mesh.size());
  for (Placement p : inner.placements) {
    p.mesh_dim += shift;
    out.placements.push_back(p);
  }
  out.placements.insert(out.placements.end(), outer.placements.begin(), outer.placements.end());
  return out;
}

std::string describe(const Layout& layout) {
  std::ostringstream out;
  out << "[" << join(layout.shape) << "] on mesh [" << join(layout.mesh) << "]: ";
  if (layout.placements.empty()) out << "replicated";
  for (size_t i = 0; i < layout.placements.size(); ++i) {
    out << (i ? ", " : "") << describe(layout.placements[i]);
  }
  return out.str();
}

void validate(const Layout& layout) {
  check_static(layout);
  // Whether packed divides what it splits depends on what the earlier placements left each
  // coordinate (uneven splits leave the last ranks less), so every coordinate is tried.
  const bool packs = std::any_of(layout.placements.begin(), layout.placements.end(),
                                 [](const Placement& p) { return p.packed != 1; });
  if (!packs) return;
  for (int64_t rank = 0; rank < product(layout.mesh); ++rank) {
    hold(layout, coordinate_of(rank, layout.mesh));
  }
}

Held held(const Layout& layout, const std::vector<int64_t>& coordinate) {
  check_static(layout);
  check_coordinate(layout, coordinate);
  return hold(layout, coordinate);
}

std::vector<int64_t> local_shape(const Layout& layout, const std::vector<int64_t>& coordinate) {
  const Held h = held(layout, coordinate);
  std::vector<int64_t> shape;
  for (const auto& list : h.dims) shape.push_back(total(list));
  return shape;
}

std::vector<int64_t> padded_local_shape(const Layout& layout) {
  validate(layout);
  std::vector<int64_t> shape = layout.shape;
  for (const Placement& p : layout.placements) {
    if (p.kind != Placement::Kind::kShard) continue;
    const int64_t block = shape[p.dim] / p.packed;
    const int64_t ranks = layout.mesh[p.mesh_dim];
    shape[p.dim] = p.packed * ((block + ranks - 1) / ranks);
  }
  return shape;
}

std::vector<Piece> pieces(const Layout& saved, const Layout& wanted,
                          const std::vector<int64_t>& wanted_coordinate) {
  validate(saved);
  validate(wanted);
  TORCH_CHECK(saved.shape == wanted.shape, "ddp: pieces: the saved shape [", join(saved.shape),
              "] and the wanted shape [", join(wanted.shape),
              "] differ; a layout change moves elements between ranks, it cannot reshape");
  check_coordinate(wanted, wanted_coordinate);
  const Held want = hold(wanted, wanted_coordinate);

  // Holders at coordinate 0 on every mesh dim that does not shard partition the tensor: each
  // element is copied once, and a replicated save reads one copy.
  std::vector<bool> sharded(saved.mesh.size(), false);
  for (const Placement& p : saved.placements) {
    if (p.kind == Placement::Kind::kShard) sharded[p.mesh_dim] = true;
  }
  const size_t dims = saved.shape.size();
  std::vector<Piece> out;
  for (int64_t rank = 0; rank < product(saved.mesh); ++rank) {
    const std::vector<int64_t> source = coordinate_of(rank, saved.mesh);
    bool reads = true;
    for (size_t m = 0; m < source.size(); ++m) reads = reads && (sharded[m] || source[m] == 0);
    if (!reads) continue;
    const Held have = hold(saved, source);
    std::vector<std::vector<Segment>> runs(dims);
    bool shares = true;
    for (size_t d = 0; d < dims && shares; ++d) {
      runs[d] = shared_runs(have.dims[d], want.dims[d]);
      shares = !runs[d].empty();
    }
    if (!shares) continue;
    // The boxes are the cartesian product of the per-dim runs, the last dim varying fastest.
    std::vector<size_t> at(dims, 0);
    while (true) {
      Piece piece;
      piece.source = source;
      for (size_t d = 0; d < dims; ++d) {
        piece.source_offset.push_back(runs[d][at[d]].source);
        piece.dest_offset.push_back(runs[d][at[d]].dest);
        piece.length.push_back(runs[d][at[d]].length);
      }
      out.push_back(std::move(piece));
      size_t d = dims;
      while (d > 0 && ++at[d - 1] == runs[d - 1].size()) at[--d] = 0;
      if (d == 0) break;
    }
  }

  std::vector<int64_t> extents;
  for (const auto& list : want.dims) extents.push_back(total(list));
  int64_t copied = 0;
  for (const Piece& piece : out) copied += product(piece.length);
  if (copied != product(extents)) {
    std::vector<size_t> every(out.size());
    for (size_t i = 0; i < out.size(); ++i) every[i] = i;
    std::vector<int64_t> prefix;
    const auto hole = first_uncovered(out, every, extents, prefix);
    if (hole) {
      std::vector<int64_t> global;
      for (size_t d = 0; d < dims; ++d) global.push_back(global_of(want.dims[d], (*hole)[d]));
      TORCH_CHECK(false, "ddp: pieces: element [", join(global), "] (local [", join(*hole),
                  "] of coordinate [", join(wanted_coordinate), "] under ", describe(wanted),
                  ") is held by none of the holders under ", describe(saved));
    }
    TORCH_CHECK(false, "ddp: pieces: ", copied, " elements copied into the ", product(extents),
                " of coordinate [", join(wanted_coordinate), "] under ", describe(wanted),
                ": holders under ", describe(saved), " overlap");
  }
  return out;
}

}  // namespace ddp::layout
