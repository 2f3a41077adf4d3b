/* Compiled as C11: includes the C ABI's header and calls every function in it, as a C program
 * (or a language's foreign-function layer) does. With no process group to join, every call that
 * needs one gets a NULL, freed or foreign handle, or a NULL argument, and must answer with the
 * status and the exact message the header promises: never a crash. Prints "c abi: N checks
 * passed" (ctest and the package test look for it); exit 1 names the first failed check. */
#include <stdio.h>
#include <string.h>

#include "ddp/c/ddp.h"

static int checks = 0;

static int expect(ddp_status got, ddp_status want, const char* message) {
  ++checks;
  if (got != want) {
    fprintf(stderr, "check %d: status %d, expected %d (%s)\n", checks, (int)got, (int)want,
            ddp_last_error());
    return 1;
  }
  if (message != NULL && strcmp(ddp_last_error(), message) != 0) {
    fprintf(stderr, "check %d: message '%s', expected '%s'\n", checks, ddp_last_error(), message);
    return 1;
  }
  return 0;
}

int main(void) {
  const ddp_status bad = DDP_ERROR_INVALID_ARGUMENT;
  /* A handle libddp never made: the table refuses it without reading it. */
  ddp_group* foreign_group = (ddp_group*)(void*)&checks;
  ddp_model* foreign_model = (ddp_model*)(void*)&checks;
  int failed = 0;
  int value = 0;
  int64_t step = 0;
  double norm = 0;
  size_t needed = 0;
  char text[8];
  ddp_group* group = NULL;
  ddp_model* model = NULL;
  ddp_group_options group_options;
  ddp_options options;

  if (ddp_abi_version() != DDP_ABI_VERSION || strlen(ddp_version()) == 0) {
    fprintf(stderr, "version %d '%s'\n", ddp_abi_version(), ddp_version());
    return 1;
  }
  ddp_group_options_init(&group_options);
  ddp_options_init(&options);
  if (group_options.rank != -1 || options.bucket_cap_mb != 25.0 ||
      options.gradient_as_bucket_view != 1) {
    fprintf(stderr, "defaults: rank %d, bucket cap %f\n", group_options.rank,
            options.bucket_cap_mb);
    return 1;
  }
  group_options.timeout_ms = -1;
  failed |= expect(ddp_group_create(&group_options, &group), bad,
                   "ddp_group_create: timeout_ms -1 is negative");
  failed |=
      expect(ddp_group_create(NULL, NULL), bad, "ddp_group_create: the group out-pointer is NULL");
  failed |= expect(ddp_group_rank(NULL, &value), bad, "ddp_group_rank: the group is NULL");
  failed |= expect(ddp_group_world_size(foreign_group, &value), bad,
                   "ddp_group_world_size: the group is not a handle libddp made (a ddp_group* "
                   "comes from ddp_group_create)");
  failed |= expect(ddp_group_free(NULL), bad, "ddp_group_free: the group is NULL");
  failed |= expect(ddp_broadcast(NULL, NULL, 0, 0), bad, "ddp_broadcast: the group is NULL");
  failed |= expect(ddp_model_create(NULL, NULL, NULL, 0, NULL, &model), bad,
                   "ddp_model_create: the group is NULL");
  failed |= expect(ddp_model_free(foreign_model), bad,
                   "ddp_model_free: the model is not a handle libddp made (a ddp_model* comes "
                   "from ddp_model_create)");
  failed |=
      expect(ddp_model_forward_begin(NULL), bad, "ddp_model_forward_begin: the model is NULL");
  failed |=
      expect(ddp_model_forward_end(NULL, NULL, 0), bad, "ddp_model_forward_end: the model is NULL");
  failed |=
      expect(ddp_model_no_sync_begin(NULL), bad, "ddp_model_no_sync_begin: the model is NULL");
  failed |= expect(ddp_model_no_sync_end(NULL), bad, "ddp_model_no_sync_end: the model is NULL");
  failed |= expect(ddp_model_zero_grad(NULL), bad, "ddp_model_zero_grad: the model is NULL");
  failed |= expect(ddp_model_clip_grad_norm(NULL, 1.0, &norm), bad,
                   "ddp_model_clip_grad_norm: the model is NULL");
  failed |= expect(ddp_model_stats(NULL, text, sizeof text, &needed), bad,
                   "ddp_model_stats: the model is NULL");
  failed |= expect(ddp_checkpoint_save(NULL, "ckpt", NULL, NULL, 0, 0), bad,
                   "ddp_checkpoint_save: the group is NULL");
  failed |= expect(ddp_checkpoint_load(NULL, "ckpt", NULL, NULL, 0, &step), bad,
                   "ddp_checkpoint_load: the group is NULL");
  if (failed) return 1;
  printf("c abi: %d checks passed\n", checks);
  return 0;
}
