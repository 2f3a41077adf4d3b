#pragma once
// The C ABI's boundary (include/ddp/c/ddp.h): every exported function runs its body through
// guarded(), which turns any C++ exception into a status and the thread's last error, so none
// crosses into C; and handles are entries of a HandleTable, looked up on every call, so a NULL,
// freed or foreign handle is an error with a message, never a dereference.

#include <c10/util/Exception.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "ddp/c/ddp.h"

namespace ddp::c_abi {

// A refusal of the boundary itself, with its status.
struct AbiError : std::runtime_error {
  AbiError(ddp_status s, const std::string& message) : std::runtime_error(message), status(s) {}
  ddp_status status;
};

std::string& last_error();  // this thread's

template <typename Body>
ddp_status guarded(const char* function, Body&& body) noexcept {
  try {
    body();
    return DDP_OK;
  } catch (const AbiError& e) {
    last_error() = std::string(function) + ": " + e.what();
    return e.status;
  } catch (const c10::Error& e) {
    last_error() = std::string(function) + ": " + e.what_without_backtrace();
    return DDP_ERROR_RUNTIME;
  } catch (const std::bad_alloc&) {
    last_error() = std::string(function) + ": out of memory";
    return DDP_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    last_error() = std::string(function) + ": " + e.what();
    return DDP_ERROR_RUNTIME;
  } catch (...) {
    last_error() = std::string(function) + ": an unknown error";
    return DDP_ERROR_RUNTIME;
  }
}

// Handles of one kind: opaque pointers that are numbers from a counter (never reused, never
// dereferenced by the caller), mapped to the objects they stand for.
template <typename Object, typename Handle>
class HandleTable {
 public:
  explicit HandleTable(const char* kind) : kind_(kind) {}

  Handle* add(std::shared_ptr<Object> object) {
    std::lock_guard<std::mutex> lock(mutex_);
    // Odd numbers from a high base: never NULL, never a real allocation's (aligned) address.
    const uintptr_t id = (uintptr_t{0x6464700000} + next_++) * 2 + 1;
    objects_[id] = std::move(object);
    return reinterpret_cast<Handle*>(id);
  }
  std::shared_ptr<Object> get(const Handle* handle) const {
    if (handle == nullptr)
      throw AbiError(DDP_ERROR_INVALID_ARGUMENT, std::string(kind_) + " is NULL");
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = objects_.find(reinterpret_cast<uintptr_t>(handle));
    if (it == objects_.end()) {
      throw AbiError(DDP_ERROR_INVALID_ARGUMENT,
                     std::string(kind_) +
                         " is not a live handle (freed already, or not one of "
                         "libddp's)");
    }
    return it->second;
  }
  // The object, which lives on while a caller of get() still holds it.
  std::shared_ptr<Object> remove(const Handle* handle) {
    std::shared_ptr<Object> object = get(handle);
    std::lock_guard<std::mutex> lock(mutex_);
    objects_.erase(reinterpret_cast<uintptr_t>(handle));
    return object;
  }

 private:
  const char* kind_;
  mutable std::mutex mutex_;
  uintptr_t next_ = 0;
  std::unordered_map<uintptr_t, std::shared_ptr<Object>> objects_;
};

}  // namespace ddp::c_abi
