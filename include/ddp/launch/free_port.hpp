#pragma once
// A TCP port for rank 0's store when the user names none.

#include <cstdint>

namespace ddp::launch {

// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it, close). Another
// process may take it before the store binds it; the window is milliseconds. Throws
// std::runtime_error with errno's text when no socket can be bound.
uint16_t find_free_port();

}  // namespace ddp::launch
