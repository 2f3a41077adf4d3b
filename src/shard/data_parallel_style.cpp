#include "ddp/shard/data_parallel_style.hpp"

#include <c10/util/Exception.h>

namespace ddp::shard {

const char* style_name(DataParallelStyle style) {
  switch (style) {
    case DataParallelStyle::kReplicate:
      return "replicate";
    case DataParallelStyle::kFullyShard:
      return "fully_shard";
    case DataParallelStyle::kDefault:
      return "default";
  }
  return "?";
}

DataParallelStyle parse_style(const std::string& text) {
  for (auto style : {DataParallelStyle::kReplicate, DataParallelStyle::kFullyShard,
                     DataParallelStyle::kDefault}) {
    if (text == style_name(style)) return style;
  }
  TORCH_CHECK(false, "ddp: unknown data-parallel style '", text,
              "'; the styles are replicate, fully_shard, default");
}

}  // namespace ddp::shard
