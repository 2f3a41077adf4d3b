/* A C target of the downstream project, linked to ddp::ddp_c (the shared C ABI library) by
 * find_package(ddp) alone: prints the ABI version the library reports. */
#include <stdio.h>

#include "ddp/c/ddp.h"

int main(void) {
  if (ddp_abi_version() != DDP_ABI_VERSION) return 1;
  printf("c consumer: ddp_c ABI %d, libddp %s\n", ddp_abi_version(), ddp_version());
  return 0;
}
