#include "ddp/buckets/bucket_plan.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <tuple>

namespace ddp::buckets {

std::vector<size_t> reverse_registration_order(size_t n) {
  std::vector<size_t> order(n);
  std::iota(order.rbegin(), order.rend(), size_t{0});
  return order;
}

namespace {

void check_order(const std::vector<size_t>& order, size_t n) {
  TORCH_CHECK(order.size() == n, "ddp: bucket order has ", order.size(), " entries for ", n,
              " parameters; it must be a permutation of 0..", n, "-1");
  std::vector<bool> seen(n, false);
  for (size_t p : order) {
    TORCH_CHECK(p < n && !seen[p], "ddp: bucket order is not a permutation: index ", p,
                p < n ? " repeats" : " is out of range");
    seen[p] = true;
  }
}

// A bucket being filled, plus the position in `order` of its first parameter (its sort key).
struct OpenBucket {
  Bucket bucket;
  size_t first_position = 0;
};

void add_param(Bucket& b, size_t index, const ParamSpec& spec) {
  b.params.push_back(index);
  b.offsets.push_back(b.numel);
  b.lengths.push_back(spec.numel);
  b.numel += spec.numel;
  b.bytes += static_cast<size_t>(spec.numel) * c10::elementSize(spec.dtype);
}

}  // namespace

BucketPlan plan_buckets(const std::vector<ParamSpec>& params, const PlanOptions& options) {
  const size_t n = params.size();
  const std::vector<size_t> order =
      options.order.empty() ? reverse_registration_order(n) : options.order;
  check_order(order, n);
  TORCH_CHECK(options.first_bucket_cap_bytes > 0 && options.bucket_cap_bytes > 0,
              "ddp: bucket caps must be positive (first ", options.first_bucket_cap_bytes,
              " B, later ", options.bucket_cap_bytes, " B)");

  using Key = std::tuple<int, int, int>;  // dtype, device type, device index
  std::map<Key, OpenBucket> open;
  std::map<Key, size_t> closed_count;  // how many buckets each key has closed: picks the cap
  std::vector<OpenBucket> done;

  for (size_t pos = 0; pos < n; ++pos) {
    const size_t p = order[pos];
    const ParamSpec& spec = params[p];
    if (spec.sparse) {
      OpenBucket alone{{}, pos};
      alone.bucket.dtype = spec.dtype;
      alone.bucket.device = spec.device;
      alone.bucket.sparse = true;
      add_param(alone.bucket, p, spec);
      done.push_back(std::move(alone));
      continue;
    }
    const Key key{static_cast<int>(spec.dtype), static_cast<int>(spec.device.type()),
                  static_cast<int>(spec.device.index())};
    auto it = open.find(key);
    if (it == open.end()) {
      OpenBucket fresh{{}, pos};
      fresh.bucket.dtype = spec.dtype;
      fresh.bucket.device = spec.device;
      it = open.emplace(key, std::move(fresh)).first;
    }
    add_param(it->second.bucket, p, spec);
    const size_t cap =
        closed_count[key] == 0 ? options.first_bucket_cap_bytes : options.bucket_cap_bytes;
    if (it->second.bucket.bytes >= cap) {
      done.push_back(std::move(it->second));
      open.erase(it);
      ++closed_count[key];
    }
  }
  for (auto& [key, b] : open) done.push_back(std::move(b));

  std::stable_sort(done.begin(), done.end(), [](const OpenBucket& a, const OpenBucket& b) {
    return a.first_position < b.first_position;
  });

  BucketPlan plan;
  plan.bucket_of.assign(n, 0);
  plan.position_in_bucket.assign(n, 0);
  for (size_t b = 0; b < done.size(); ++b) {
    const Bucket& bucket = done[b].bucket;
    for (size_t i = 0; i < bucket.params.size(); ++i) {
      plan.bucket_of[bucket.params[i]] = b;
      plan.position_in_bucket[bucket.params[i]] = i;
    }
    plan.buckets.push_back(bucket);
  }
  return plan;
}

void describe(const PlanOptions& options, const std::string& prefix,
              std::vector<std::pair<std::string, std::string>>& out) {
  out.emplace_back(prefix + "first_bucket_cap_bytes",
                   std::to_string(options.first_bucket_cap_bytes));
  out.emplace_back(prefix + "bucket_cap_bytes", std::to_string(options.bucket_cap_bytes));
}

size_t mib_bytes(double mib) {
  TORCH_CHECK(mib > 0, "ddp: a bucket cap must be a positive number of MiB, got ", mib);
  return static_cast<size_t>(mib * static_cast<double>(kMiB));
}

std::vector<size_t> complete_order(const std::vector<size_t>& partial, size_t n) {
  std::vector<bool> seen(n, false);
  std::vector<size_t> order;
  for (size_t p : partial) {
    if (p < n && !seen[p]) {
      seen[p] = true;
      order.push_back(p);
    }
  }
  for (size_t i = n; i-- > 0;) {
    if (!seen[i]) order.push_back(i);
  }
  return order;
}

}  // namespace ddp::buckets
