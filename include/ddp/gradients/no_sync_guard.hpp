#pragma once
// NoSyncGuard: the scope of no_sync() for every data-parallel wrapper (DistributedDataParallel,
// the sharded styles). Inside it backwards communicate nothing and gradients accumulate locally;
// the next synchronized backward reduces the accumulated sum. It clears the wrapper's
// "require sync" flag and restores the previous value on exit, so scopes nest.

namespace ddp::gradients {

class NoSyncGuard {
 public:
  explicit NoSyncGuard(bool& require_sync) : flag_(require_sync), previous_(require_sync) {
    flag_ = false;
  }
  ~NoSyncGuard() { flag_ = previous_; }
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;

 private:
  bool& flag_;
  bool previous_;
};

}  // namespace ddp::gradients
