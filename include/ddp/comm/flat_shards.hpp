#pragma once
// FlatShards: how a flat tensor of `numel` elements is split over the `world` ranks of a group by
// reduce_scatter and all_gather: the house's one split rule, layout::EvenSplit ([Note: the even
// split rule], layout/even_split.hpp), under the collectives' name.

#include "ddp/layout/even_split.hpp"

namespace ddp::comm {

using FlatShards = layout::EvenSplit;

}  // namespace ddp::comm
