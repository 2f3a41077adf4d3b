#pragma once
// The C ABI's boundary (include/ddp/c/ddp.h): every exported function runs its body through
// guarded(), which turns any C++ exception into a status and the thread's last error, so none
// crosses into C; and handles are entries of a HandleTable, looked up on every call, so a NULL,
// freed, forged or other kind's handle is an error with a message, never a dereference.

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

// "function: message", once: a message the library already began with the function's name (a
// check that names its caller) keeps that one prefix.
inline std::string with_function(const char* function, const std::string& message) {
  const std::string prefix = std::string(function) + ": ";
  return message.rfind(prefix, 0) == 0 ? message : prefix + message;
}

template <typename Body>
ddp_status guarded(const char* function, Body&& body) noexcept {
  try {
    body();
    return DDP_OK;
  } catch (const AbiError& e) {
    last_error() = with_function(function, e.what());
    return e.status;
  } catch (const c10::Error& e) {
    last_error() = with_function(function, e.what_without_backtrace());
    return DDP_ERROR_RUNTIME;
  } catch (const std::bad_alloc&) {
    last_error() = with_function(function, "out of memory");
    return DDP_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    last_error() = with_function(function, e.what());
    return DDP_ERROR_RUNTIME;
  } catch (...) {
    last_error() = with_function(function, "an unknown error");
    return DDP_ERROR_RUNTIME;
  }
}

// A handle's number says what it is: bits 40-63 libddp's mark (above any user-space address on
// a 64-bit machine), bits 4-39 a serial from one counter for every kind (never reused), bits 1-3
// its kind, bit 0 set (never an aligned pointer). So a handle of another kind, a freed one and
// one libddp never made are told apart, and each is refused by what it is; a binding's FFI that
// declares every handle `void*` (docs/bindings.md) cannot pass one kind for the other unnoticed.
enum class HandleKind : uintptr_t { kGroup = 1, kModel = 2 };

struct HandleKindNames {
  const char* noun;   // "group": the argument's role in messages
  const char* ctype;  // "ddp_group*"
  const char* maker;  // "ddp_group_create"
};
inline HandleKindNames kind_names(HandleKind kind) {
  return kind == HandleKind::kGroup ? HandleKindNames{"group", "ddp_group*", "ddp_group_create"}
                                    : HandleKindNames{"model", "ddp_model*", "ddp_model_create"};
}

static_assert(sizeof(uintptr_t) == 8, "handle numbers need a 64-bit address space");
constexpr uintptr_t kHandleMark = uintptr_t{0x646470} << 40;  // "ddp"
constexpr uintptr_t kHandleMarkMask = ~((uintptr_t{1} << 40) - 1);
constexpr int kHandleSerialShift = 4;

inline uintptr_t handle_number(HandleKind kind, uintptr_t serial) {
  return kHandleMark | serial << kHandleSerialShift | static_cast<uintptr_t>(kind) << 1 | 1;
}
inline bool is_handle_number(uintptr_t number) {
  return (number & kHandleMarkMask) == kHandleMark && (number & 1) == 1;
}
inline uintptr_t kind_bits(uintptr_t number) { return (number >> 1) & 7; }
inline uintptr_t serial_of(uintptr_t number) {
  return (number & ~kHandleMarkMask) >> kHandleSerialShift;
}

// The serials of every table: one counter, so no two live or freed handles share a number.
uintptr_t next_handle_serial();
// The serials handed out so far (a number below it, of the right kind, not live: freed).
uintptr_t handle_serials_issued();

// The live handles of one kind, mapped to the objects they stand for; every call looks its handle
// up here, so a handle is never dereferenced.
template <typename Object, typename Handle>
class HandleTable {
 public:
  explicit HandleTable(HandleKind kind) : kind_(kind) {}

  Handle* add(std::shared_ptr<Object> object) {
    const uintptr_t id = handle_number(kind_, next_handle_serial());
    std::lock_guard<std::mutex> lock(mutex_);
    objects_[id] = std::move(object);
    return reinterpret_cast<Handle*>(id);
  }
  std::shared_ptr<Object> get(const Handle* handle) const {
    const HandleKindNames want = kind_names(kind_);
    const std::string role = std::string("the ") + want.noun;
    if (handle == nullptr) throw AbiError(DDP_ERROR_INVALID_ARGUMENT, role + " is NULL");
    const auto number = reinterpret_cast<uintptr_t>(handle);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto it = objects_.find(number);
      if (it != objects_.end()) return it->second;
    }
    throw AbiError(DDP_ERROR_INVALID_ARGUMENT, role + why_not(number, want));
  }
  // The object, which lives on while a caller of get() still holds it.
  std::shared_ptr<Object> remove(const Handle* handle) {
    std::shared_ptr<Object> object = get(handle);
    std::lock_guard<std::mutex> lock(mutex_);
    objects_.erase(reinterpret_cast<uintptr_t>(handle));
    return object;
  }

 private:
  // Why `number` is no live handle of this kind, as the rest of a sentence after "the group".
  std::string why_not(uintptr_t number, const HandleKindNames& want) const {
    const std::string made_by =
        std::string(" (a ") + want.ctype + " comes from " + want.maker + ")";
    if (!is_handle_number(number) || serial_of(number) >= handle_serials_issued()) {
      return " is not a handle libddp made" + made_by;
    }
    for (const HandleKind other : {HandleKind::kGroup, HandleKind::kModel}) {
      if (other != kind_ && kind_bits(number) == static_cast<uintptr_t>(other)) {
        const HandleKindNames got = kind_names(other);
        return std::string(" is a ") + got.noun + " handle (" + got.ctype + "), not a " +
               want.noun + made_by;
      }
    }
    if (kind_bits(number) != static_cast<uintptr_t>(kind_)) {
      return " is not a handle libddp made" + made_by;
    }
    return " was freed already" + made_by;
  }

  HandleKind kind_;
  mutable std::mutex mutex_;
  std::unordered_map<uintptr_t, std::shared_ptr<Object>> objects_;
};

}  // namespace ddp::c_abi
