"""libddp's C ABI driven from a second language: Python's ctypes over python3-torch's tensors, the
way a binding uses it. Only the shared library is loaded (dlopen); every handle is a plain void*,
as in an FFI that does not know C's distinct pointer types.

A tensor crosses as an at::Tensor*. Python holds a tensor's TensorImpl* (`t._cdata`), and an
at::Tensor is one pointer to its TensorImpl, so a one-pointer cell holding `_cdata` is an at::Tensor
for the length of a call (docs/bindings.md, the Python row). libddp copies what it keeps.

Each rank (started by ddp-run with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) trains a small net
with two micro-batches per step (the first under no_sync), the clip and SGD with momentum, and
checks: the parameters equal the single-process oracle on the global batch (rel. err < 1e-5), the
clip norm equals torch's, a broadcast, a checkpoint round trip bit for bit, the stats; then every
handle of the wrong kind, freed, forged or NULL is refused with its exact text, no message names
its function twice, and every function of the ABI list has been called.

Usage: ddp-run --nproc-per-node N -- python3 ctypes_binding.py LIBDDP_C_SO ABI_SYMBOLS CKPT_ROOT
DDP_TEST_DEVICE=cuda runs it on NCCL with one GPU per rank (LOCAL_RANK), as scripts/gpu-check.sh
does with the GPU machine's torch.
"""
import ctypes
import os
import sys

import torch

LIB_PATH, SYMBOLS_PATH, CKPT_ROOT = sys.argv[1:4]
lib = ctypes.CDLL(LIB_PATH)
called = set()

OK, INVALID_ARGUMENT, INVALID_STATE, RUNTIME = 0, 1, 2, 3
P = ctypes.c_void_p
PP = ctypes.POINTER(ctypes.c_void_p)
NAMES = ctypes.POINTER(ctypes.c_char_p)


class GroupOptions(ctypes.Structure):
    _fields_ = [("backend", ctypes.c_char_p), ("timeout_ms", ctypes.c_int64),
                ("rank", ctypes.c_int), ("world_size", ctypes.c_int),
                ("master_addr", ctypes.c_char_p), ("master_port", ctypes.c_int)]


class Options(ctypes.Structure):
    _fields_ = [("first_bucket_cap_mb", ctypes.c_double), ("bucket_cap_mb", ctypes.c_double),
                ("find_unused_parameters", ctypes.c_int), ("static_graph", ctypes.c_int),
                ("gradient_as_bucket_view", ctypes.c_int), ("comm_hook", ctypes.c_char_p)]


SIGNATURES = {
    "ddp_abi_version": (ctypes.c_int, []),
    "ddp_version": (ctypes.c_char_p, []),
    "ddp_last_error": (ctypes.c_char_p, []),
    "ddp_group_options_init": (None, [ctypes.POINTER(GroupOptions)]),
    "ddp_group_create": (ctypes.c_int, [ctypes.POINTER(GroupOptions), PP]),
    "ddp_group_rank": (ctypes.c_int, [P, ctypes.POINTER(ctypes.c_int)]),
    "ddp_group_world_size": (ctypes.c_int, [P, ctypes.POINTER(ctypes.c_int)]),
    "ddp_group_free": (ctypes.c_int, [P]),
    "ddp_broadcast": (ctypes.c_int, [P, PP, ctypes.c_size_t, ctypes.c_int]),
    "ddp_options_init": (None, [ctypes.POINTER(Options)]),
    "ddp_model_create": (ctypes.c_int, [P, PP, NAMES, ctypes.c_size_t,
                                        ctypes.POINTER(Options), PP]),
    "ddp_model_free": (ctypes.c_int, [P]),
    "ddp_model_forward_begin": (ctypes.c_int, [P]),
    "ddp_model_forward_end": (ctypes.c_int, [P, PP, ctypes.c_size_t]),
    "ddp_model_no_sync_begin": (ctypes.c_int, [P]),
    "ddp_model_no_sync_end": (ctypes.c_int, [P]),
    "ddp_model_zero_grad": (ctypes.c_int, [P]),
    "ddp_model_clip_grad_norm": (ctypes.c_int, [P, ctypes.c_double,
                                                ctypes.POINTER(ctypes.c_double)]),
    "ddp_model_stats": (ctypes.c_int, [P, ctypes.c_char_p, ctypes.c_size_t,
                                       ctypes.POINTER(ctypes.c_size_t)]),
    "ddp_checkpoint_save": (ctypes.c_int, [P, ctypes.c_char_p, PP, NAMES, ctypes.c_size_t,
                                           ctypes.c_int64]),
    "ddp_checkpoint_load": (ctypes.c_int, [P, ctypes.c_char_p, PP, NAMES, ctypes.c_size_t,
                                           ctypes.POINTER(ctypes.c_int64)]),
}
for name, (restype, argtypes) in SIGNATURES.items():
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = restype, argtypes


def call(name, *args):
    called.add(name)
    return getattr(lib, name)(*args)


def last_error():
    return call("ddp_last_error").decode()


def ok(status, what):
    assert status == OK, f"{what}: status {status}: {last_error()}"


def refused(status, want, message):
    got = last_error()
    assert status == want, f"status {status}, expected {want} ({got})"
    assert got == message, f"message {got!r}, expected {message!r}"
    function = got.split(":")[0]
    assert got.find(function, len(function)) < 0, f"{got!r} names {function} twice"


class Tensors:
    """at::Tensor* for a list of tensors: one cell per tensor holding its TensorImpl*, and an array
    of the cells' addresses. Keep it (and the tensors) alive for the call."""

    def __init__(self, tensors):
        self.tensors = list(tensors)
        self.cells = [ctypes.c_void_p(t._cdata) for t in self.tensors]
        self.array = (ctypes.c_void_p * len(self.cells))(
            *[ctypes.addressof(c) for c in self.cells])
        self.count = len(self.cells)


def names_array(names):
    return (ctypes.c_char_p * len(names))(*[n.encode() for n in names])


def make_net():
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 5))


def main():
    assert call("ddp_abi_version") == 1 and call("ddp_version")
    cuda = os.environ.get("DDP_TEST_DEVICE", "cpu") == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else "cpu"
    group_options = GroupOptions()
    call("ddp_group_options_init", ctypes.byref(group_options))
    group_options.timeout_ms = 60000
    group_options.backend = b"nccl" if cuda else b"gloo"
    group = ctypes.c_void_p()
    ok(call("ddp_group_create", ctypes.byref(group_options), ctypes.byref(group)),
       "ddp_group_create")
    rank, world = ctypes.c_int(), ctypes.c_int()
    ok(call("ddp_group_rank", group, ctypes.byref(rank)), "ddp_group_rank")
    ok(call("ddp_group_world_size", group, ctypes.byref(world)), "ddp_group_world_size")
    rank, world = rank.value, world.value

    torch.manual_seed(rank)  # rank 0's values are broadcast: seed 0, the oracle's
    net = make_net().to(device)
    named = sorted(net.named_parameters())  # the same order on every rank
    names = [n for n, _ in named]
    params = Tensors(p for _, p in named)
    options = Options()
    call("ddp_options_init", ctypes.byref(options))
    options.first_bucket_cap_mb = options.bucket_cap_mb = 0.0002  # a few buckets of this net
    model = ctypes.c_void_p()
    ok(call("ddp_model_create", group, params.array, names_array(names), params.count,
            ctypes.byref(options), ctypes.byref(model)), "ddp_model_create")
    torch.manual_seed(0)
    oracle = make_net().to(device)
    opt = torch.optim.SGD([p for _, p in named], lr=0.1, momentum=0.9)
    oracle_opt = torch.optim.SGD(oracle.parameters(), lr=0.1, momentum=0.9)

    torch.manual_seed(1)
    per_rank = 4  # two micro-batches of 2 per step
    for _ in range(3):
        x = torch.randn(world * per_rank, 6).to(device)
        y = torch.randn(world * per_rank, 5).to(device)
        mine = [slice(rank * per_rank + m * 2, rank * per_rank + m * 2 + 2) for m in (0, 1)]
        ok(call("ddp_model_no_sync_begin", model), "ddp_model_no_sync_begin")
        for micro in (0, 1):
            if micro == 1:
                ok(call("ddp_model_no_sync_end", model), "ddp_model_no_sync_end")
            ok(call("ddp_model_forward_begin", model), "ddp_model_forward_begin")
            out = net(x[mine[micro]])
            outputs = Tensors([out])
            ok(call("ddp_model_forward_end", model, outputs.array, 1), "ddp_model_forward_end")
            (torch.nn.functional.mse_loss(out, y[mine[micro]]) / 2).backward()
        norm = ctypes.c_double()
        ok(call("ddp_model_clip_grad_norm", model, 0.5, ctypes.byref(norm)),
           "ddp_model_clip_grad_norm")
        opt.step()
        ok(call("ddp_model_zero_grad", model), "ddp_model_zero_grad")
        torch.nn.functional.mse_loss(oracle(x), y).backward()
        want = float(torch.nn.utils.clip_grad_norm_(oracle.parameters(), 0.5))
        assert abs(norm.value - want) <= 1e-5 * want, f"clip norm {norm.value}, torch's {want}"
        oracle_opt.step()
        oracle_opt.zero_grad()
    worst = 0.0
    oracle_named = dict(oracle.named_parameters())
    for name, p in named:
        o = oracle_named[name].detach()
        worst = max(worst, float((p.detach() - o).abs().max() / o.abs().max()))
    assert worst < 1e-5, f"parameters differ from the oracle: max rel. error {worst}"

    needed = ctypes.c_size_t()
    ok(call("ddp_model_stats", model, None, 0, ctypes.byref(needed)), "ddp_model_stats")
    text = ctypes.create_string_buffer(needed.value)
    ok(call("ddp_model_stats", model, text, needed.value, None), "ddp_model_stats")
    assert "3 iterations" in text.value.decode(), text.value

    mine_value = torch.full((3,), float(rank), device=device)
    cell = Tensors([mine_value])
    ok(call("ddp_broadcast", group, cell.array, 1, world - 1), "ddp_broadcast")
    assert torch.equal(mine_value.cpu(), torch.full((3,), float(world - 1))), mine_value

    root = CKPT_ROOT.encode()
    ok(call("ddp_checkpoint_save", group, root, params.array, names_array(names), params.count, 3),
       "ddp_checkpoint_save")
    saved = [p.detach().clone() for _, p in named]
    with torch.no_grad():
        for _, p in named:
            p.fill_(7)
    step = ctypes.c_int64()
    ok(call("ddp_checkpoint_load", group, root, params.array, names_array(names), params.count,
            ctypes.byref(step)), "ddp_checkpoint_load")
    assert step.value == 3, step.value
    for (name, p), s in zip(named, saved):
        assert torch.equal(p.detach(), s), f"{name} did not load back bit for bit"

    # Outputs no trainable parameter reaches: refused, the model stays usable.
    ok(call("ddp_model_forward_begin", model), "ddp_model_forward_begin")
    detached = Tensors([net(torch.randn(2, 6).to(device)).detach()])
    refused(call("ddp_model_forward_end", model, detached.array, 1), RUNTIME,
            "ddp_model_forward_end: none of the model's 4 trainable parameters is reachable "
            "from the 1 output(s) (a detached tensor, or one the model's parameters did not "
            "compute): the next backward would reduce no gradient. Pass the forward's outputs, "
            "or set find_unused_parameters for a forward that may use none")

    # Handles: another kind's, freed, forged, NULL; every function that takes one.
    group_fns = {
        "ddp_group_rank": lambda g: call("ddp_group_rank", g, ctypes.byref(ctypes.c_int())),
        "ddp_group_world_size":
            lambda g: call("ddp_group_world_size", g, ctypes.byref(ctypes.c_int())),
        "ddp_broadcast": lambda g: call("ddp_broadcast", g, None, 0, 0),
        "ddp_model_create": lambda g: call("ddp_model_create", g, params.array,
                                           names_array(names), params.count, None,
                                           ctypes.byref(ctypes.c_void_p())),
        "ddp_checkpoint_save":
            lambda g: call("ddp_checkpoint_save", g, root, None, None, 0, 0),
        "ddp_checkpoint_load": lambda g: call("ddp_checkpoint_load", g, root, None, None, 0,
                                              ctypes.byref(ctypes.c_int64())),
        "ddp_group_free": lambda g: call("ddp_group_free", g),
    }
    model_fns = {
        "ddp_model_forward_begin": lambda m: call("ddp_model_forward_begin", m),
        "ddp_model_forward_end": lambda m: call("ddp_model_forward_end", m, detached.array, 1),
        "ddp_model_no_sync_begin": lambda m: call("ddp_model_no_sync_begin", m),
        "ddp_model_no_sync_end": lambda m: call("ddp_model_no_sync_end", m),
        "ddp_model_zero_grad": lambda m: call("ddp_model_zero_grad", m),
        "ddp_model_clip_grad_norm": lambda m: call("ddp_model_clip_grad_norm", m, 1.0, None),
        "ddp_model_stats": lambda m: call("ddp_model_stats", m, None, 0, None),
        "ddp_model_free": lambda m: call("ddp_model_free", m),
    }
    group_from = " (a ddp_group* comes from ddp_group_create)"
    model_from = " (a ddp_model* comes from ddp_model_create)"
    forged = ctypes.c_void_p(0x7F00DEADBEE1)
    # Each function of one kind handed the other kind's handle, a forged pointer and NULL.
    for kind, fns, made_by, other, other_handle in (
            ("group", group_fns, group_from, "model handle (ddp_model*)", model),
            ("model", model_fns, model_from, "group handle (ddp_group*)", group)):
        for fn_name, fn in fns.items():
            refused(fn(other_handle), INVALID_ARGUMENT,
                    f"{fn_name}: the {kind} is a {other}, not a {kind}{made_by}")
            refused(fn(forged), INVALID_ARGUMENT,
                    f"{fn_name}: the {kind} is not a handle libddp made{made_by}")
            refused(fn(None), INVALID_ARGUMENT, f"{fn_name}: the {kind} is NULL")

    ok(call("ddp_model_free", model), "ddp_model_free")
    ok(call("ddp_group_free", group), "ddp_group_free")
    for fn_name, fn in model_fns.items():
        refused(fn(model), INVALID_ARGUMENT, f"{fn_name}: the model was freed already{model_from}")
    for fn_name, fn in group_fns.items():
        refused(fn(group), INVALID_ARGUMENT, f"{fn_name}: the group was freed already{group_from}")

    with open(SYMBOLS_PATH) as listed:
        every = {line.strip() for line in listed if line.strip()}
    assert called == every, f"not called: {sorted(every - called)}"
    if rank == 0:
        print(f"ctypes binding: world {world} passed, {len(called)} functions, "
              f"max rel. error {worst:.1e}")


main()
