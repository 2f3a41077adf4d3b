/* libddp's C ABI: data-parallel training for any language that holds libtorch tensors (tch-rs,
 * TorchSharp, javacpp's pytorch presets, mlverse torch's lantern, torch.rb, ...). A binding passes
 * its parameters' tensors as `at::Tensor*` (void* here) with their names; libddp installs hooks in
 * the autograd engine every binding shares, so the binding's own backward() then averages the
 * gradients over the ranks in buckets, overlapped with the rest of backward, exactly as for a C++
 * user of ddp::DistributedDataParallel. docs/bindings.md shows each binding's few lines.
 *
 * Load it as the shared library libddp_c.so.1 (pkg-config --libs ddp, CMake's ddp::ddp_c, or a
 * dlopen): it exports these functions only.
 *
 * Rules: every call returns a ddp_status; on failure ddp_last_error() (per thread) says what is
 * wrong and nothing has changed that the call did not say it changes. No C++ exception crosses
 * this boundary. Handles are numbers that carry their kind, never reused and never dereferenced:
 * a handle of the other kind, a freed, forged or NULL one is DDP_ERROR_INVALID_ARGUMENT naming
 * what it is, not a crash. Pointers passed in (tensors, names, options) need to live for the call
 * only: libddp keeps its own references. Keep a model's handle alive while training (it holds the
 * hooks), call its functions from the thread that runs forward and backward, one handle per model.
 * Plain C11: no C++ type appears here. */
#ifndef DDP_C_DDP_H
#define DDP_C_DDP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI's version: bumped when a function's signature or meaning changes (never silently: the
 * exported symbol list is checked by a test). */
#define DDP_ABI_VERSION 1

typedef enum ddp_status {
  DDP_OK = 0,
  DDP_ERROR_INVALID_ARGUMENT = 1, /* a NULL, freed or foreign handle; a bad option or tensor */
  DDP_ERROR_INVALID_STATE = 2,    /* a call out of order (no_sync_end without begin, ...) */
  DDP_ERROR_RUNTIME = 3,          /* the library refused or a collective failed (mismatched ranks,
                                     a timeout, a missing gradient, a file error): see the message */
  DDP_ERROR_OUT_OF_MEMORY = 4
} ddp_status;

typedef struct ddp_group ddp_group; /* a process group (the ranks of one job) */
typedef struct ddp_model ddp_model; /* a set of parameters trained data-parallel */

/* DDP_ABI_VERSION of the library linked, and its release ("0.1.0"). */
int ddp_abi_version(void);
const char* ddp_version(void);
/* The message of this thread's last failed call ("" when none failed). Valid until the next call
 * on this thread. */
const char* ddp_last_error(void);

/* ---- process groups ---------------------------------------------------------------------- */
typedef struct ddp_group_options {
  const char* backend;     /* "gloo" (CPU tensors) or "nccl" (CUDA); NULL: "gloo" */
  int64_t timeout_ms;      /* bound of every collective and of the rendezvous; 0: 300000 */
  int rank;                /* -1: from the environment (RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID) */
  int world_size;          /* -1: from the environment (WORLD_SIZE, ...) */
  const char* master_addr; /* NULL: MASTER_ADDR */
  int master_port;         /* 0: MASTER_PORT */
} ddp_group_options;

/* Defaults: everything from the launcher's environment (torchrun, ddp-run, mpirun, srun). */
void ddp_group_options_init(ddp_group_options* options);
/* Collective: every rank calls it; returns once all have joined (or fails naming who is not). */
ddp_status ddp_group_create(const ddp_group_options* options, ddp_group** group);
ddp_status ddp_group_rank(const ddp_group* group, int* rank);
ddp_status ddp_group_world_size(const ddp_group* group, int* world_size);
/* A model made from the group keeps using it: freeing the handle only ends this handle. */
ddp_status ddp_group_free(ddp_group* group);
/* Collective: `count` tensors (at::Tensor*) take root's values, in place. */
ddp_status ddp_broadcast(ddp_group* group, void* const* tensors, size_t count, int root);

/* ---- data-parallel models ---------------------------------------------------------------- */
typedef struct ddp_options {
  double first_bucket_cap_mb;  /* 1.0, as PyTorch: the first bucket starts communication early */
  double bucket_cap_mb;        /* 25.0, as PyTorch */
  int find_unused_parameters;  /* 0; 1: parameters some forwards do not use count as zeros */
  int static_graph;            /* 0; 1: the used set of the first step is the same every step */
  int gradient_as_bucket_view; /* 1: gradients live in the buckets (no copy in or out) */
  const char* comm_hook;       /* NULL, "none" or "allreduce": the average; "fp16", "bf16" */
} ddp_options;

void ddp_options_init(ddp_options* options);
/* Collective: wraps `count` parameters (at::Tensor*, leaves; `names` their qualified names, e.g.
 * "fc1.weight") as one model. Every rank must pass the same names, shapes and dtypes (checked;
 * a mismatch names the tensor); rank 0's values are broadcast. Parameters that do not require
 * grad are broadcast but not reduced. `options` NULL: defaults. */
ddp_status ddp_model_create(ddp_group* group, void* const* params, const char* const* names,
                            size_t count, const ddp_options* options, ddp_model** model);
ddp_status ddp_model_free(ddp_model* model);
/* Around the binding's forward: begin before it, end after it with the forward's outputs
 * (at::Tensor*, at least one; their graph is walked to predict the order gradients become ready
 * and to find the parameters they reach). Outputs that reach no trainable parameter (a detached
 * tensor) are refused, DDP_ERROR_RUNTIME, unless find_unused_parameters is set. The next backward,
 * from a loss computed from those outputs, then reduces the gradients. */
ddp_status ddp_model_forward_begin(ddp_model* model);
ddp_status ddp_model_forward_end(ddp_model* model, void* const* outputs, size_t count);
/* Forwards and backwards between begin and end accumulate gradients locally; the next
 * synchronized backward reduces the sum (gradient accumulation). */
ddp_status ddp_model_no_sync_begin(ddp_model* model);
ddp_status ddp_model_no_sync_end(ddp_model* model);
/* Zeroes every gradient in place (the buckets stay the gradients). */
ddp_status ddp_model_zero_grad(ddp_model* model);
/* Scales the gradients so that their total 2-norm is at most max_norm (torch's clip_grad_norm_);
 * `total_norm` (may be NULL) receives the norm before clipping. */
ddp_status ddp_model_clip_grad_norm(ddp_model* model, double max_norm, double* total_norm);
/* The runtime stats (buckets, compute, communication, overlap) as text. Writes at most `size`
 * bytes including the terminating 0 into `text` (may be NULL when size is 0); `needed` (may be
 * NULL) receives the full length + 1. */
ddp_status ddp_model_stats(ddp_model* model, char* text, size_t size, size_t* needed);

/* ---- checkpoints ------------------------------------------------------------------------- */
/* Collective: saves `count` named tensors and `step` as <root>/step-<step>/ (atomic; rank 0
 * writes, every rank waits until it is complete; the 3 newest are kept). */
ddp_status ddp_checkpoint_save(ddp_group* group, const char* root, void* const* tensors,
                               const char* const* names, size_t count, int64_t step);
/* Collective: loads the newest complete checkpoint under `root` into the named tensors (in
 * place) and sets `step`; *step = -1 and nothing changes when there is none. */
ddp_status ddp_checkpoint_load(ddp_group* group, const char* root, void* const* tensors,
                               const char* const* names, size_t count, int64_t* step);

#ifdef __cplusplus
}
#endif

#endif /* DDP_C_DDP_H */
