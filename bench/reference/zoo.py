"""The benchmark model zoo on the PyTorch side: the same parameter names, shapes, registration
order and math as the C++ zoo (models/include/ddp/models/), plus each model's loss and a random
batch maker. Used by torch_ddp.py and bench/compare; see docs/bench-protocol.md."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = ("toy", "toy8k", "mlp-deep", "gpt-tiny", "gpt2-small", "gpt2-medium", "gpt-char",
          "resnet-small", "llama-tiny", "llama-1b", "llama-3b", "llama-8b")
# The models --tie-weights applies to: those with a token embedding to tie the output layer to.
TIED_WEIGHTS_MODELS = ("gpt-tiny", "gpt2-small", "gpt2-medium", "gpt-char")
# torch >= 2.0: the fused kernel (flash / memory-efficient on CUDA), as models/src/causal_attention.cpp
# uses at::scaled_dot_product_attention there; 1.13 has none, and both sides write attention out.
FUSED_ATTENTION = hasattr(F, "scaled_dot_product_attention")


# ---------------------------------------------------------------------------------------------
# Models: one class per C++ model, registering submodules in the C++ constructor's order.
# ---------------------------------------------------------------------------------------------


class Net(nn.Module):
    """models/src/net.cpp: fc4(fc3(fc2(fc1(x)))), no activation."""

    def __init__(self, dim):
        super().__init__()
        self.fc1 = nn.Linear(dim, dim)
        self.fc2 = nn.Linear(dim, dim)
        self.fc3 = nn.Linear(dim, dim)
        self.fc4 = nn.Linear(dim, dim)

    def forward(self, x):
        return self.fc4(self.fc3(self.fc2(self.fc1(x))))


class MLP(nn.Module):
    """models/src/mlp.cpp: layers.0..layers.<depth-1>, ReLU between layers, none after the last.
    The ReLUs are applied in forward, not stored in the Sequential, so layer i is layers.i."""

    def __init__(self, width=512, depth=16):
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])

    def forward(self, x):
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < last:
                x = torch.relu(x)
        return x


def causal_attention(q, k, v):
    """models/src/causal_attention.cpp: q, k, v [B, H, T, hd] -> [B, H, T, hd], position t
    attending to positions <= t, scale 1/sqrt(hd). Fused where torch has it, else written out."""
    if FUSED_ATTENTION:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return written_out_causal_attention(q, k, v)


def written_out_causal_attention(q, k, v):
    """The same math on every torch version (torch 1.13's path, and the fused path's check)."""
    seq, head_dim = q.size(-2), q.size(-1)
    att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(head_dim))
    future = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
    att = att.masked_fill(future, float("-inf"))
    att = torch.softmax(att, dim=-1)
    return torch.matmul(att, v)


class CausalSelfAttention(nn.Module):
    """models/src/gpt.cpp's attention (causal_attention: fused on torch >= 2.0, as on the C++
    side)."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.head_dim = d_model // n_heads
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        batch, seq, _ = x.shape
        # The head count comes from the tensors, as in gpt.cpp: under tensor parallelism c_attn
        # yields this rank's heads only ([q_r, k_r, v_r], torch_tp.py).
        q, k, v = self.c_attn(x).chunk(3, dim=2)

        def to_heads(t):
            return t.view(batch, seq, -1, self.head_dim).transpose(1, 2)  # [B, H, T, hd]

        y = causal_attention(to_heads(q), to_heads(k), to_heads(v))  # [B, H, T, hd]
        y = y.transpose(1, 2).contiguous().view(batch, seq, -1)
        return self.c_proj(y)


class GPTMLP(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.c_fc = nn.Linear(d_model, 4 * d_model)
        self.c_proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))  # exact (erf) GELU, libtorch's default too


class GPTBlock(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = GPTMLP(d_model)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def normal_init(model):
    """GPT-2's init (models/normal_init.hpp) in modules() order: every Linear and Embedding weight
    ~ N(0, 0.02), Linear biases zero."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, 0.0, 0.02)


class GPT(nn.Module):
    """models/src/gpt.cpp's GPTImpl: wte, wpe, h.<i>, ln_f, lm_head (no bias). tie_weights:
    lm_head.weight is wte.weight, as in GPT-2 (named_parameters() then lists it once, as wte.weight,
    as ddp-bench's --save-params does)."""

    def __init__(self, vocab_size, seq_len, d_model, n_heads, n_layers, tie_weights=False):
        super().__init__()
        assert d_model % n_heads == 0, f"GPT: d_model {d_model} not divisible by n_heads {n_heads}"
        self.seq_len = seq_len
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.h = nn.ModuleList([GPTBlock(d_model, n_heads) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        normal_init(self)  # GPT-2's init in modules() order, as the C++ constructor does it
        if tie_weights:
            # After the init, as the C++ constructor ties: lm_head's own draw is dropped, so the
            # generator ends where the untied model's does.
            self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        seq = idx.size(1)
        assert seq <= self.seq_len, f"GPT: input length {seq} exceeds seq_len {self.seq_len}"
        positions = torch.arange(seq, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class RMSNorm(nn.Module):
    """models/src/llama.cpp's RMSNorm: normalised in fp32, cast back, then the weight (Meta's)."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rotary_tables(seq_len, head_dim, theta):
    """({cos}, {sin}) [seq_len, head_dim / 2] fp32, computed in float64 (llama.cpp's)."""
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    inv_freq = torch.pow(torch.tensor(theta, dtype=torch.float64), -2.0 * i / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rotary(x, cos, sin):
    """Rotates adjacent pairs of x [B, T, H, hd] in fp32, cast back (llama.cpp's apply_rotary)."""
    seq, half = x.size(1), x.size(3) // 2
    pairs = x.float().unflatten(-1, (half, 2))
    x0, x1 = pairs[..., 0], pairs[..., 1]
    c = cos[:seq].view(1, seq, 1, half)
    s = sin[:seq].view(1, seq, 1, half)
    return torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], -1).flatten(-2).to(x.dtype)


class LlamaAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__()
        self.head_dim = d_model // n_heads
        self.wq = nn.Linear(d_model, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, d_model, bias=False)

    def forward(self, x, cos, sin):
        batch, seq, _ = x.shape

        def heads(t):
            return t.view(batch, seq, -1, self.head_dim)

        q = apply_rotary(heads(self.wq(x)), cos, sin).transpose(1, 2)
        k = apply_rotary(heads(self.wk(x)), cos, sin).transpose(1, 2)
        v = heads(self.wv(x)).transpose(1, 2)
        n_rep = q.size(1) // k.size(1)
        if n_rep > 1:  # each key/value head serves n_rep query heads in a row (Meta's repeat_kv)
            k = k.unsqueeze(2).expand(batch, k.size(1), n_rep, seq, self.head_dim).reshape(
                batch, -1, seq, self.head_dim)
            v = v.unsqueeze(2).expand(batch, v.size(1), n_rep, seq, self.head_dim).reshape(
                batch, -1, seq, self.head_dim)
        y = causal_attention(q, k, v).transpose(1, 2).contiguous().view(batch, seq, -1)
        return self.wo(y)


class LlamaFeedForward(nn.Module):
    def __init__(self, d_model, ffn_hidden):
        super().__init__()
        self.w1 = nn.Linear(d_model, ffn_hidden, bias=False)
        self.w2 = nn.Linear(ffn_hidden, d_model, bias=False)
        self.w3 = nn.Linear(d_model, ffn_hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, ffn_hidden, eps):
        super().__init__()
        self.attention_norm = RMSNorm(d_model, eps)
        self.attention = LlamaAttention(d_model, n_heads, n_kv_heads)
        self.ffn_norm = RMSNorm(d_model, eps)
        self.feed_forward = LlamaFeedForward(d_model, ffn_hidden)
        self.rotary = None  # (cos, sin), handed over by the root before each forward

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x), *self.rotary)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """models/src/llama.cpp's LlamaImpl: tok_embeddings, layers.<i>, norm, output (no bias), the
    rotary tables as buffers rope_cos / rope_sin; every Linear and Embedding weight ~ N(0, 0.02) in
    modules() order, norms ones; tie_weights: output.weight is tok_embeddings.weight."""

    def __init__(self, vocab_size, seq_len, d_model, n_layers, n_heads, n_kv_heads, ffn_hidden,
                 rope_theta=500000.0, norm_eps=1e-5, tie_weights=False):
        super().__init__()
        self.seq_len = seq_len
        self.head_dim, self.rope_theta = d_model // n_heads, rope_theta  # init_weights' tables
        self.tok_embeddings = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList([LlamaBlock(d_model, n_heads, n_kv_heads, ffn_hidden, norm_eps)
                                     for _ in range(n_layers)])
        self.norm = RMSNorm(d_model, norm_eps)
        self.output = nn.Linear(d_model, vocab_size, bias=False)
        cos, sin = rotary_tables(seq_len, d_model // n_heads, rope_theta)
        self.register_buffer("rope_cos", cos)
        self.register_buffer("rope_sin", sin)
        normal_init(self)  # no Linear has a bias: the same draws as models/src/llama.cpp
        if tie_weights:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, idx):
        assert idx.size(1) <= self.seq_len, f"Llama: input length {idx.size(1)} exceeds {self.seq_len}"
        x = self.tok_embeddings(idx)
        for block in self.layers:
            # The block itself, inside a checkpoint_wrapper (--fsdp-checkpoint) where there is one.
            getattr(block, "_checkpoint_wrapped_module", block).rotary = (self.rope_cos, self.rope_sin)
            x = block(x)
        return self.output(self.norm(x))


def init_weights(model):
    """The constructor's init drawn again into a GPT's or a Llama's existing storage: FSDP2's
    large-model path (built on the meta device, sharded, to_empty, then this on each rank's
    shards; torch_ddp.py --meta-init). Every Linear and Embedding weight ~ N(0, 0.02) in modules()
    order, Linear biases zero, LayerNorm and RMSNorm weights one and biases zero, a Llama's rotary
    tables computed again. The values are the constructor's distributions, not its numbers."""
    if not isinstance(model, (GPT, Llama)):
        raise ValueError(f"init_weights: a GPT or Llama model, got {type(model).__name__}")
    normal_init(model)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.LayerNorm, RMSNorm)):
                nn.init.ones_(m.weight)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        if isinstance(model, Llama):
            cos, sin = rotary_tables(model.seq_len, model.head_dim, model.rope_theta)
            model.rope_cos.copy_(cos)
            model.rope_sin.copy_(sin)


def _conv(cin, cout, kernel, stride):
    return nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, bias=False)


class BasicBlock(nn.Module):
    """models/src/resnet.cpp's BasicBlock (torchvision's, with downsample registered last)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = _conv(cin, cout, 3, stride)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = _conv(cout, cout, 3, 1)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(_conv(cin, cout, 1, stride), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = self.downsample(x) if self.downsample is not None else x
        return torch.relu(out + shortcut)


class ResNetSmall(nn.Module):
    """models/src/resnet.cpp: torchvision's resnet18 with a 3x3 stride-1 stem and no max-pool."""

    def __init__(self, num_classes=10, width=64):
        super().__init__()
        self.conv1 = _conv(3, width, 3, 1)
        self.bn1 = nn.BatchNorm2d(width)

        def layer(cin, cout, stride):
            return nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1))

        self.layer1 = layer(width, width, 1)
        self.layer2 = layer(width, 2 * width, 2)
        self.layer3 = layer(2 * width, 4 * width, 2)
        self.layer4 = layer(4 * width, 8 * width, 2)
        self.fc = nn.Linear(8 * width, num_classes)
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                elif isinstance(m, nn.BatchNorm2d):
                    nn.init.ones_(m.weight)
                    nn.init.zeros_(m.bias)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.layer4(self.layer3(self.layer2(self.layer1(y))))
        y = F.adaptive_avg_pool2d(y, (1, 1)).flatten(1)
        return self.fc(y)


def regression_loss(out, y):
    """registry.cpp's squared_error: summed over features, mean over the batch."""
    return (out.to(y.dtype) - y).pow(2).sum(-1).mean()


def token_loss(out, y):
    """registry.cpp's token_cross_entropy: cross entropy over flattened logits, mean."""
    return F.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1))


# name -> (constructor, loss, input spec). Input spec: ("float", shape) with x, y ~ N(0, 1), or
# ("tokens", seq, vocab) for int64 x and y, or ("image", classes) for float images, int64 labels.
_GPT = dict(vocab_size=4096, seq_len=128, d_model=256, n_heads=4, n_layers=4)
_GPT2_SMALL = dict(vocab_size=50304, seq_len=1024, d_model=768, n_heads=12, n_layers=12)
_GPT2_MEDIUM = dict(vocab_size=50304, seq_len=1024, d_model=1024, n_heads=16, n_layers=24)
_GPT_CHAR = dict(vocab_size=256, seq_len=256, d_model=384, n_heads=6, n_layers=6)
# registry.cpp's Llama rows: the CPU tests' tiny one, then Llama 3.2 1B / 3B and 3.1 8B.
_LLAMA_TINY = dict(vocab_size=4096, seq_len=128, d_model=256, n_layers=4, n_heads=8, n_kv_heads=2,
                   ffn_hidden=768)
_LLAMA3 = dict(vocab_size=128256, seq_len=8192, n_kv_heads=8)
_LLAMA_1B = dict(_LLAMA3, d_model=2048, n_layers=16, n_heads=32, ffn_hidden=8192, tie_weights=True)
_LLAMA_3B = dict(_LLAMA3, d_model=3072, n_layers=28, n_heads=24, ffn_hidden=8192, tie_weights=True)
_LLAMA_8B = dict(_LLAMA3, d_model=4096, n_layers=32, n_heads=32, ffn_hidden=14336)
SPECS = {
    "toy": (lambda: Net(2000), regression_loss, ("float", 2000)),
    "toy8k": (lambda: Net(8192), regression_loss, ("float", 8192)),
    "mlp-deep": (lambda: MLP(512, 16), regression_loss, ("float", 512)),
    "gpt-tiny": (lambda tie=False: GPT(**_GPT, tie_weights=tie), token_loss,
                 ("tokens", _GPT["seq_len"], _GPT["vocab_size"])),
    "gpt2-small": (lambda tie=False: GPT(**_GPT2_SMALL, tie_weights=tie), token_loss,
                   ("tokens", 1024, 50304)),
    "gpt2-medium": (lambda tie=False: GPT(**_GPT2_MEDIUM, tie_weights=tie), token_loss,
                    ("tokens", 1024, 50304)),
    "gpt-char": (lambda tie=False: GPT(**_GPT_CHAR, tie_weights=tie), token_loss,
                 ("tokens", 256, 256)),
    "resnet-small": (lambda: ResNetSmall(10, 64), token_loss, ("image", 10)),
    "llama-tiny": (lambda: Llama(**_LLAMA_TINY), token_loss, ("tokens", 128, 4096)),
    "llama-1b": (lambda: Llama(**_LLAMA_1B), token_loss, ("tokens", 8192, 128256)),
    "llama-3b": (lambda: Llama(**_LLAMA_3B), token_loss, ("tokens", 8192, 128256)),
    "llama-8b": (lambda: Llama(**_LLAMA_8B), token_loss, ("tokens", 8192, 128256)),
}


def tie_weights_error(name):
    """The complaint about --tie-weights for model `name`, or None where it applies (the same
    words as ddp-bench's, tools/common/ddp_flags.cpp)."""
    if name in TIED_WEIGHTS_MODELS:
        return None
    return (f"--tie-weights needs a GPT model ({', '.join(TIED_WEIGHTS_MODELS)}), got --model {name}, "
            "which has no token embedding to tie")


# The GPT and Llama rows' shapes, which --seq-len, --n-layer, --n-embd and --n-head change
# (ddp-bench's flags).
SHAPES = {"gpt-tiny": (GPT, _GPT), "gpt2-small": (GPT, _GPT2_SMALL),
          "gpt2-medium": (GPT, _GPT2_MEDIUM), "gpt-char": (GPT, _GPT_CHAR),
          "llama-tiny": (Llama, _LLAMA_TINY), "llama-1b": (Llama, _LLAMA_1B),
          "llama-3b": (Llama, _LLAMA_3B), "llama-8b": (Llama, _LLAMA_8B)}


def build_model(name, tie_weights=False, seq_len=None, n_layers=None, d_model=None, n_heads=None):
    """The zoo's model `name`; seq_len / n_layers / d_model / n_heads (None: the row's) for the
    GPTs and Llamas."""
    if tie_weights:
        error = tie_weights_error(name)
        if error is not None:
            raise ValueError(error)
    changed = {key: value for key, value in (("seq_len", seq_len), ("n_layers", n_layers),
                                             ("d_model", d_model), ("n_heads", n_heads)) if value}
    if not changed:
        return SPECS[name][0](tie=True) if tie_weights else SPECS[name][0]()
    if name not in SHAPES:
        raise ValueError("--seq-len, --n-layer, --n-embd and --n-head need a GPT or Llama model, "
                         f"got --model {name}")
    cls, shape = SHAPES[name]
    shape = dict(shape, **changed)
    if tie_weights:
        shape["tie_weights"] = True
    return cls(**shape)


def loss_fn(name):
    return SPECS[name][1]


def random_batch(name, batch, generator=None, device="cpu", seq_len=None):
    """A batch (x, y) of the model's input/target shapes and dtypes, random; seq_len (None: the
    row's) for the token models."""
    spec = SPECS[name][2]
    if seq_len and spec[0] == "tokens":
        spec = ("tokens", seq_len, spec[2])
    if spec[0] == "float":
        d = spec[1]
        x = torch.randn(batch, d, generator=generator)
        y = torch.randn(batch, d, generator=generator)
    elif spec[0] == "tokens":
        seq, vocab = spec[1], spec[2]
        x = torch.randint(0, vocab, (batch, seq), generator=generator)
        y = torch.randint(0, vocab, (batch, seq), generator=generator)
    else:
        classes = spec[1]
        x = torch.randn(batch, 3, 32, 32, generator=generator)
        y = torch.randint(0, classes, (batch,), generator=generator)
    return x.to(device), y.to(device)


# ---------------------------------------------------------------------------------------------
# Command line
