#pragma once
// The shard plan: for a data-parallel style, which parameters are sharded on dim 0 over the group
// and which are replicated, how many rows each rank owns, and which unit (the parameters gathered
// by one collective) each parameter belongs to. Pure: names, shapes and dtypes in, a plan out; the
// sharded runtime (shard/, issue 12) executes it, the unit table prints it.
//
// [Note: styles] As torch/distributed/_spmd/data_parallel.py:
//   kReplicate   every parameter replicated, gradients all-reduced (DistributedDataParallel).
//   kFullyShard  every parameter with at least one dimension sharded on dim 0 (ZeRO-3, FSDP2
//                fully_shard); dim 0 is padded up to world * ceil(dim0 / world) when it does not
//                divide, so the last ranks may own fewer rows or none (comm/flat_shards.hpp's even
//                split rule, torch.chunk's). A 0-dim parameter has no dim 0: replicated.
//   kDefault     sharded when dim 0 divides evenly by the group size (no padding), replicated
//                otherwise: one backward mixes reduce-scatter and all-reduce. PyTorch's seed raises
//                "not supported yet" for it.
//
// [Note: units] A unit is named by a submodule's qualified name ("h.0"); it holds every parameter
// whose qualified name starts with "<unit>.". Units may nest: a parameter belongs to the deepest
// unit that contains it (FSDP2's rule: an inner fully_shard claims its parameters first). The root
// unit ("", printed "<root>") holds what no named unit claims; it exists only when it holds
// something. A parameter with several names (tied weights) goes to the deepest unit that contains
// all of them, so that it stays gathered while any of its users runs (wte / lm_head: the root).
// Units are ordered as their first parameter in registration order, root last.

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ddp/layout/layout.hpp"
#include "ddp/shard/data_parallel_style.hpp"

namespace ddp::shard {

// One distinct parameter (tied weights once), in registration order.
struct ParamShape {
  ParamShape() = default;
  ParamShape(std::string name_, std::vector<int64_t> shape_,
             c10::ScalarType dtype_ = c10::ScalarType::Float,
             std::vector<std::string> aliases_ = {})
      : name(std::move(name_)),
        shape(std::move(shape_)),
        dtype(dtype_),
        aliases(std::move(aliases_)) {}

  std::string name;            // qualified name, e.g. "h.0.attn.c_attn.weight"
  std::vector<int64_t> shape;  // sizes; empty for a 0-dim parameter
  c10::ScalarType dtype = c10::ScalarType::Float;
  // The other names of a tied parameter (GPT's lm_head.weight for wte.weight): every name must
  // lie in its unit, see [Note: units].
  std::vector<std::string> aliases;
  // False for a frozen parameter (requires_grad false): it has no gradient to reduce-scatter, so
  // every style keeps it whole (replicated) and leaves it alone.
  bool trainable = true;
};

struct ParamShard {
  // What each rank holds, over the mesh {world}: Shard(tensor dim 0) when sharded (the even split
  // with padding, layout/even_split.hpp), no placement when replicated. The one description every
  // runtime and ShardedModule::layout() read.
  layout::Layout layout;
  bool sharded() const { return !layout.placements.empty(); }
  size_t unit = 0;  // index into ShardPlan::units

  // Derived from `layout`, never kept beside it (two descriptions would agree only by luck):
  // dim 0 (1 for a 0-dim parameter); the elements per row (the product of the other sizes); the
  // rows a full shard holds (the layout's padded local dim 0 when sharded, else every row).
  int64_t rows() const;
  int64_t row_numel() const;
  int64_t chunk() const;
  // Rows rank r (of the layout's mesh {world}) holds between steps: chunk() for the first ranks,
  // fewer or 0 at the end when sharded with padding; all of them when replicated.
  int64_t rows_on(int rank) const;
  // Elements of this parameter's local storage on every rank: chunk() * row_numel() (the padded
  // shard; equal on every rank, so a unit's flat shard has one size everywhere).
  int64_t local_numel() const { return chunk() * row_numel(); }
  // Padding rows added to reach world * chunk() (0 when dim 0 divides, or when replicated).
  int64_t padding_rows() const;
};

struct Unit {
  std::string name;            // the submodule's qualified name; "" for the root unit
  std::vector<size_t> params;  // indices into ShardPlan::params, registration order
  int64_t local_numel = 0;     // sum of local_numel() over its parameters: its flat shard
};

struct ShardPlan {
  DataParallelStyle style = DataParallelStyle::kReplicate;
  int world = 1;
  std::vector<ParamShape> shapes;  // as given
  std::vector<ParamShard> params;  // parallel to shapes
  std::vector<Unit> units;         // see [Note: units]

  // Bytes this rank keeps between steps for the parameters (the padded shards of the sharded
  // ones, the whole of the replicated ones).
  int64_t local_param_bytes() const;
};

// [Note: styles]: whether `style` shards `p` on dim 0 over `world` ranks (else it is replicated).
bool style_shards(const ParamShape& p, int world, DataParallelStyle style);

// Plans `params` over a group of `world` ranks. `unit_names`: qualified submodule names (none: the
// whole model is one unit, the root). Throws c10::Error when world < 1, when a unit name is
// listed twice, or when a unit holds no parameter ("ddp: unit 'h.9' holds no parameter: no
// parameter name starts with 'h.9.'"), the usual sign of a misspelt policy.
ShardPlan plan_shards(const std::vector<ParamShape>& params,
                      const std::vector<std::string>& unit_names, int world,
                      DataParallelStyle style);

// The unit table, printed by --verbose: one row per parameter, grouped by unit, with its shape,
// placement and the bytes each rank holds (the bucket table's layout, bucket_table.hpp).
//   +-------+------------+--------+-----------+---------------------+
//   | Unit  | Param Names| Shape  | Style     | Shard bytes per rank|
std::string format_unit_table(const ShardPlan& plan);

}  // namespace ddp::shard
