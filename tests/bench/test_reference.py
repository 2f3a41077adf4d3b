#!/usr/bin/python3
"""Tests of the Python side of the benchmark protocol: bench/reference/safetensors_io.py and
bench/reference/torch_ddp.py (docs/bench-protocol.md). No C++ build needed.

    /usr/bin/python3 -m unittest discover -s tests/bench -v      # ~1 min on 2 cores

The C++ zoo's names and math are checked against these models by bench/compare --parity (both
sides built); here the expected names are written out from models/include/ddp/models/*.hpp.
"""

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest

import torch
import torch.nn.functional as F

from bench_support import REF_DIR, ROOT, SCRIPT, rel_diff, run_reference  # noqa: E402,F401
import recipe  # noqa: E402
import safetensors_io  # noqa: E402
import torch_ddp  # noqa: E402
import torch_fsdp  # noqa: E402
import torch_tp  # noqa: E402
import zoo  # noqa: E402


class SafetensorsTest(unittest.TestCase):
    def test_round_trip_keeps_dtypes_shapes_values_and_order(self):
        tensors = {
            "z.f32": torch.randn(3, 4),
            "a.f64": torch.randn(2, dtype=torch.float64),
            "m.f16": torch.randn(5, dtype=torch.float16),
            "b.bf16": torch.randn(2, 3, dtype=torch.bfloat16),
            "i64": torch.arange(7),
            "i32": torch.arange(3, dtype=torch.int32),
            "u8": torch.arange(4, dtype=torch.uint8),
            "bool": torch.tensor([True, False, True]),
            "scalar": torch.tensor(2.5),
            "empty": torch.empty(0, 3),
        }
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "t.safetensors")
            safetensors_io.save_file(tensors, path, metadata={"k": "v"})
            back = safetensors_io.load_file(path)
            self.assertEqual(list(back), list(tensors))  # order kept, not sorted
            for name, t in tensors.items():
                self.assertEqual(back[name].dtype, t.dtype, name)
                self.assertEqual(back[name].shape, t.shape, name)
                self.assertTrue(torch.equal(back[name], t), name)
            self.assertEqual(safetensors_io.load_metadata(path), {"k": "v"})
            with open(path, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
            self.assertEqual(n % 8, 0, "header padded to 8 bytes")

    def test_truncated_file_is_an_error_naming_the_tensor(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "t.safetensors")
            safetensors_io.save_file({"w": torch.randn(100)}, path)
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) - 4)
            with self.assertRaisesRegex(ValueError, "'w'"):
                safetensors_io.load_file(path)


class ModelsTest(unittest.TestCase):
    """Names, shapes and order as the C++ headers document them."""

    def names(self, model):
        return [n for n, _ in torch_ddp.build_model(model).named_parameters()]

    def test_toy(self):
        self.assertEqual(self.names("toy"), [f"fc{i}.{k}" for i in range(1, 5) for k in ("weight", "bias")])

    def test_mlp_deep(self):
        self.assertEqual(self.names("mlp-deep"),
                         [f"layers.{i}.{k}" for i in range(16) for k in ("weight", "bias")])

    def test_gpt_tiny(self):
        block = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                 "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                 "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]
        expected = (["wte.weight", "wpe.weight"] + [f"h.{i}.{n}" for i in range(4) for n in block]
                    + ["ln_f.weight", "ln_f.bias", "lm_head.weight"])
        self.assertEqual(self.names("gpt-tiny"), expected)

    def test_llama_tiny_and_its_shape_flags(self):
        # Meta's / torchtitan's names (models/include/ddp/models/llama.hpp), the rotary tables as
        # buffers; --seq-len and --n-layer reach the model and the batches, as ddp-bench's do.
        block = ["attention_norm.weight", "attention.wq.weight", "attention.wk.weight",
                 "attention.wv.weight", "attention.wo.weight", "ffn_norm.weight",
                 "feed_forward.w1.weight", "feed_forward.w2.weight", "feed_forward.w3.weight"]
        expected = (["tok_embeddings.weight"] + [f"layers.{i}.{n}" for i in range(4) for n in block]
                    + ["norm.weight", "output.weight"])
        self.assertEqual(self.names("llama-tiny"), expected)
        model = torch_ddp.build_model("llama-tiny", seq_len=32, n_layers=2)
        self.assertEqual((len(model.layers), tuple(model.rope_cos.shape)), (2, (32, 16)))
        x, y = torch_ddp.random_batch("llama-tiny", 3, seq_len=32)
        self.assertEqual((tuple(x.shape), tuple(model(x).shape)), ((3, 32), (3, 32, 4096)))
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()) as err:
            torch_ddp.parse_args(["--model", "mlp-deep", "--seq-len", "32"])
        self.assertIn("--seq-len, --n-layer, --n-embd and --n-head need a GPT or Llama model, got "
                      "--model mlp-deep", err.getvalue())
        # The 5.2 B GPT is gpt2-medium widened: --n-embd and --n-head change its rows.
        wide = torch_ddp.build_model("gpt-tiny", d_model=64, n_heads=2, n_layers=1)
        self.assertEqual(tuple(wide.lm_head.weight.shape), (4096, 64))

    def test_resnet_small_uses_torchvision_names(self):
        model = torch_ddp.build_model("resnet-small")
        shapes = {n: list(p.shape) for n, p in model.named_parameters()}
        names = list(shapes)
        self.assertEqual(len(names), 62)
        self.assertEqual(names[:6], ["conv1.weight", "bn1.weight", "bn1.bias", "layer1.0.conv1.weight",
                                     "layer1.0.bn1.weight", "layer1.0.bn1.bias"])
        self.assertEqual(names[-2:], ["fc.weight", "fc.bias"])
        self.assertEqual(shapes["conv1.weight"], [64, 3, 3, 3])
        self.assertEqual(shapes["layer2.0.downsample.0.weight"], [128, 64, 1, 1])
        self.assertEqual(shapes["layer4.1.conv2.weight"], [512, 512, 3, 3])
        self.assertEqual(shapes["fc.weight"], [10, 512])
        self.assertNotIn("layer1.0.downsample.0.weight", shapes)
        self.assertEqual(model(torch.randn(2, 3, 32, 32)).shape, (2, 10))

    def test_gpt_attention_is_causal(self):
        torch.manual_seed(0)
        model = torch_ddp.build_model("gpt-tiny")
        idx = torch.randint(0, 4096, (1, 16))
        changed = idx.clone()
        changed[0, 10:] = (changed[0, 10:] + 1) % 4096
        with torch.no_grad():
            a, b = model(idx), model(changed)
        self.assertTrue(torch.equal(a[0, :10], b[0, :10]), "a later token changed an earlier logit")
        self.assertFalse(torch.equal(a[0, 10:], b[0, 10:]))


class GptRegimeTest(unittest.TestCase):
    """The GPT as users run it: fused attention where torch has it, GPT-2's tied weights."""

    def test_attention_matches_a_float64_oracle(self):
        # One query position at a time in float64: no mask, no -inf. Forward and the gradients.
        torch.manual_seed(7)
        q, k, v = (torch.randn(2, 3, 7, 8, requires_grad=True) for _ in range(3))
        w = torch.randn(2, 3, 7, 8)
        (zoo.causal_attention(q, k, v) * w).sum().backward()
        qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
        rows = []
        for t in range(7):
            scores = qd[..., t:t + 1, :] @ kd[..., :t + 1, :].transpose(-2, -1) / 8 ** 0.5
            rows.append(torch.softmax(scores, -1) @ vd[..., :t + 1, :])
        want = torch.cat(rows, -2)
        (want * w.double()).sum().backward()
        self.assertLess(rel_diff(zoo.causal_attention(q, k, v).detach(), want.detach()), 1e-5)
        for got, ref, name in ((q, qd, "dq"), (k, kd, "dk"), (v, vd, "dv")):
            self.assertLess(rel_diff(got.grad, ref.grad), 1e-5, name)

    def test_fused_attention_exactly_where_torch_has_it(self):
        self.assertEqual(zoo.FUSED_ATTENTION, hasattr(F, "scaled_dot_product_attention"))
        if not zoo.FUSED_ATTENTION:  # torch 1.13: the written-out form, bit for bit
            q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
            self.assertTrue(torch.equal(zoo.causal_attention(q, k, v),
                                        zoo.written_out_causal_attention(q, k, v)))

    def test_tied_gpt_lists_the_shared_weight_once_as_wte(self):
        torch.manual_seed(0)
        untied = torch_ddp.build_model("gpt-tiny")
        torch.manual_seed(0)
        tied = torch_ddp.build_model("gpt-tiny", tie_weights=True)
        self.assertIs(tied.lm_head.weight, tied.wte.weight)
        names = [n for n, _ in tied.named_parameters()]
        self.assertEqual(names, [n for n, _ in untied.named_parameters() if n != "lm_head.weight"])
        # Tied after the same init: wte as the untied model draws it, 4096 x 256 fewer parameters.
        self.assertTrue(torch.equal(tied.wte.weight, untied.wte.weight))
        self.assertEqual(sum(p.numel() for p in untied.parameters())
                         - sum(p.numel() for p in tied.parameters()), 4096 * 256)

    def test_tie_weights_for_a_model_without_an_embedding_is_refused(self):
        proc = subprocess.run([sys.executable, SCRIPT, "--model", "toy", "--tie-weights"],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("torch_ddp.py: error: --tie-weights needs a GPT model (gpt-tiny, gpt2-small, "
                      "gpt2-medium, gpt-char), got --model toy, which has no token embedding to tie",
                      proc.stderr)
        with self.assertRaisesRegex(ValueError, r"^--tie-weights needs a GPT model"):
            torch_ddp.build_model("mlp-deep", tie_weights=True)


    def test_sync_bn_needs_a_batch_norm_model_on_gpus(self):
        for args, error in (
                (["--model", "toy"], "--sync-bn needs a model with BatchNorm (resnet-small), got "
                                     "--model toy"),
                (["--model", "resnet-small"], "--sync-bn needs --device cuda: PyTorch's "
                                              "SyncBatchNorm runs only on GPUs")):
            proc = subprocess.run([sys.executable, SCRIPT, *args, "--sync-bn"],
                                  capture_output=True, text=True, timeout=120, cwd=ROOT)
            self.assertEqual(proc.returncode, 2, proc.stderr)
            self.assertIn("torch_ddp.py: error: " + error, proc.stderr)


class TensorParallelPlanTest(unittest.TestCase):
    """torch_tp.py's pure parts, on any torch: the plan and the head order of c_attn's rows."""

    def test_plans_match_the_cpp_plans(self):
        self.assertEqual(torch_tp.plan_names(zoo.build_model("toy")),
                         {"fc1": "colwise", "fc2": "rowwise", "fc3": "colwise", "fc4": "rowwise"})
        plan = torch_tp.plan_names(zoo.build_model("gpt-tiny"))
        self.assertEqual(len(plan), 4 * 4)
        self.assertEqual(plan["h.3.attn.c_attn"], "colwise")
        self.assertEqual(plan["h.0.mlp.c_proj"], "rowwise")
        self.assertIsNone(torch_tp.plan_names(zoo.build_model("mlp-deep")))

    def test_each_rank_block_is_its_q_k_v_heads(self):
        d, tp = 8, 2  # rows [q | k | v], 8 each; rank r's block must be q_r, k_r, v_r
        order = torch_tp._head_order(3 * d, tp, "cpu")
        rows = torch.arange(3 * d)[order]
        self.assertEqual(rows[:12].tolist(), [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19])
        self.assertEqual(rows[12:].tolist(), [4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23])
        self.assertEqual(rows[torch.argsort(order)].tolist(), list(range(3 * d)))

    def test_tp_needs_torch_2_2_and_says_so(self):
        if torch_tp.unavailable() is None:
            self.skipTest("this torch has parallelize_module (checked on the GPU machine)")
        r = subprocess.run([sys.executable, os.path.join(REF_DIR, "torch_ddp.py"), "--tp", "2"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--tp needs torch >= 2.2 (torch.distributed.tensor.parallel and DeviceMesh); "
                      f"this is torch {torch.__version__}", r.stderr)


class CompareTest(unittest.TestCase):
    """bench/compare's flags reach both sides; --cuda-graph is refused where it cannot run."""

    @staticmethod
    def load_compare():
        import importlib.machinery
        import importlib.util
        path = os.path.join(ROOT, "bench", "compare")
        loader = importlib.machinery.SourceFileLoader("bench_compare", path)
        spec = importlib.util.spec_from_loader("bench_compare", loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module

    def test_cuda_graph_reaches_both_sides(self):
        compare = self.load_compare()
        args = compare.parse_args(["--device", "cuda", "--cuda-graph", "--model", "gpt-char"])
        for side in ("ours", "pytorch"):
            cmd = compare.side_command(args, side, "gpt-char", 1)
            self.assertIn("--cuda-graph", cmd)
            self.assertEqual(cmd[cmd.index("--nproc") + 1], "1")

    def test_recipe_args_reach_both_sides_before_their_own(self):
        compare = self.load_compare()
        args = compare.parse_args(["--recipe-args", "--optimizer adamw --grad-accum 2",
                                   "--reference-args=--static-graph"])
        for side in ("ours", "pytorch"):
            cmd = compare.side_command(args, side, "toy", 2)
            self.assertEqual(cmd[cmd.index("--optimizer"):cmd.index("--optimizer") + 4],
                             ["--optimizer", "adamw", "--grad-accum", "2"])
        cmd = compare.side_command(args, "pytorch", "toy", 2)
        self.assertLess(cmd.index("--grad-accum"), cmd.index("--static-graph"))

    def test_both_sides_get_one_micro_batch_size(self):
        # --batch-size is the micro-batch on both sides (ddp-bench's meaning, torch_ddp.py's too),
        # so the same flag measures the same work; --parity writes micro-batch x accum a step.
        compare = self.load_compare()
        for recipe_args, accum in [("", 1), ("--optimizer adamw --grad-accum 3", 3),
                                   ("--grad-accum=2", 2)]:
            args = compare.parse_args(["--batch-size", "4", f"--recipe-args={recipe_args}"])
            self.assertEqual(compare.recipe_grad_accum(args), accum, recipe_args)
            cmds = [compare.side_command(args, side, "toy", 2) for side in ("ours", "pytorch")]
            self.assertEqual([c[c.index("--batch-size") + 1] for c in cmds], ["4", "4"])

    def test_cuda_graph_refusals(self):
        for flags, want in [
                ([], "--cuda-graph needs --device cuda, not --device cpu: CUDA graphs capture GPU "
                     "work only"),
                (["--device", "cuda", "--parity"],
                 "--cuda-graph cannot be combined with --parity (its batches change every step)")]:
            r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "compare"), "--cuda-graph",
                                *flags], capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(want, r.stderr)


def mlp_deep_run_files(tmp, steps, seed, outputs):
    """mlp-deep's initial parameters (torch seed 0) and `steps` batches of 8 (generator seed
    `seed`, targets scaled to unit variance) saved in `tmp` for --init-params and --inputs:
    the parameters, and the paths by name (init, inputs and each of `outputs`)."""
    torch.manual_seed(0)
    init = {n: p.detach() for n, p in torch_ddp.build_model("mlp-deep").named_parameters()}
    gen = torch.Generator().manual_seed(seed)
    inputs = {}
    for step in range(steps):
        x, y = torch_ddp.random_batch("mlp-deep", 8, gen)
        inputs[f"x.{step}.0"], inputs[f"y.{step}.0"] = x, y / 512 ** 0.5
    f = {k: os.path.join(tmp, k + ".safetensors") for k in ("init", "inputs", *outputs)}
    safetensors_io.save_file(init, f["init"])
    safetensors_io.save_file(inputs, f["inputs"])
    return init, f


class RecipeTest(unittest.TestCase):
    """The GPT training recipe (nanoGPT's train.py): schedule, AdamW groups, accumulation."""

    def test_lr_at_closed_forms(self):
        lr, min_lr = 6e-4, 6e-5

        def at(step, warmup=4, decay_steps=12, decay="cosine"):
            return torch_ddp.lr_at(step, lr, min_lr, warmup, decay_steps, decay)

        self.assertAlmostEqual(at(0), lr / 5, delta=1e-15)  # lr / (warmup + 1)
        self.assertAlmostEqual(at(3), lr * 4 / 5, delta=1e-15)
        self.assertEqual(at(4), lr)  # the warmup's end: the peak, r = 0
        self.assertAlmostEqual(at(8), (lr + min_lr) / 2, delta=1e-15)  # mid-cosine
        self.assertAlmostEqual(at(12), min_lr, delta=1e-15)  # r = 1
        self.assertEqual(at(13), min_lr)
        self.assertEqual(at(1000), min_lr)
        self.assertAlmostEqual(at(8, decay="linear"), (lr + min_lr) / 2, delta=1e-15)
        self.assertAlmostEqual(at(6, decay="linear"), lr - (lr - min_lr) / 4, delta=1e-15)
        self.assertEqual(at(100, decay="constant"), lr)
        self.assertEqual(at(0, warmup=0, decay="constant"), lr)  # the default: --lr every step
        self.assertEqual(at(4, warmup=4, decay_steps=4), min_lr)  # a step down at the warmup's end
        self.assertEqual(at(3, warmup=4, decay_steps=4), lr * 4 / 5)

    def test_adamw_groups_decay_exactly_the_matrices_once_each(self):
        for tie in (False, True):
            model = zoo.build_model("gpt-tiny", tie_weights=tie)
            groups = torch_ddp.weight_decay_groups(model, 0.1)
            self.assertEqual([g["weight_decay"] for g in groups], [0.1, 0.0])
            decay, no_decay = ({id(p) for p in g["params"]} for g in groups)
            names = {id(p): n for n, p in model.named_parameters()}
            for n, p in model.named_parameters():
                self.assertIn(id(p), decay if p.dim() >= 2 else no_decay, n)
            listed = [id(p) for g in groups for p in g["params"]]
            self.assertEqual(sorted(listed), sorted(names), f"tie={tie}: each parameter once")
            self.assertEqual(len(listed), len(set(listed)))
            self.assertIn(id(model.wte.weight), decay)
            self.assertIn(id(model.ln_f.weight), no_decay)
            self.assertIn(id(model.h[0].attn.c_attn.bias), no_decay)
            # The optimizer the script builds holds these groups as they are.
            opt = torch_ddp.make_optimizer(model, torch_ddp.parse_args(
                ["--optimizer", "adamw", "--beta2", "0.95", "--weight-decay", "0.1"])[0])
            self.assertIsInstance(opt, torch.optim.AdamW)
            self.assertEqual([len(g["params"]) for g in opt.param_groups],
                             [len(g["params"]) for g in groups])
            self.assertEqual(opt.param_groups[0]["betas"], (0.9, 0.95))

    def test_grad_accum_matches_the_whole_batch(self):
        # 4 micro-batches of 2 accumulate to the gradient of the batch of 8, so AdamW with a
        # clip and a schedule (warmup, cosine, then min_lr) ends where the unsplit run does.
        model = "mlp-deep"
        with tempfile.TemporaryDirectory() as tmp:
            init, f = mlp_deep_run_files(tmp, steps=4, seed=1, outputs=("one", "four"))
            common = ["--model", model, "--init-params", f["init"], "--inputs", f["inputs"],
                      "--lr", "1e-3", "--optimizer", "adamw", "--grad-clip", "0.5",
                      "--warmup-steps", "1", "--lr-decay-steps", "3"]
            run_reference(*common, "--grad-accum", "1", "--save-params", f["one"])
            run_reference(*common, "--grad-accum", "4", "--save-params", f["four"])
            one, four = (safetensors_io.load_file(f[k]) for k in ("one", "four"))
        for name in init:
            self.assertGreater(rel_diff(one[name], init[name]), 0, f"{name} did not move")
            self.assertLess(rel_diff(four[name], one[name]), 1e-6, name)

    def test_batch_size_is_the_micro_batch_as_ddp_bench_s(self):
        # A step reads --batch-size x --grad-accum samples per rank (ddp-bench's and ddp-train's
        # meaning); the result line's batch is the micro-batch. An --inputs batch is the step's.
        for model, batch, accum in [("toy", 3, 1), ("mlp-deep", 3, 2), ("gpt-tiny", 2, 4)]:
            args, _ = torch_ddp.parse_args(["--model", model, "--batch-size", str(batch),
                                            "--grad-accum", str(accum)])
            batches, warmup, repeat = torch_ddp.step_batches(args, data_rank=1)
            self.assertEqual(len(batches), 1, model)
            x, y = batches[0]
            self.assertEqual((x.shape[0], y.shape[0]), (batch * accum, batch * accum), model)
            self.assertEqual((warmup, repeat), (args.warmup, args.repeat))
            # Micro-batches of --batch-size, as recipe_step chunks the step's batch.
            self.assertEqual([m.shape[0] for m in x.chunk(accum)], [batch] * accum, model)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "inputs.safetensors")
            safetensors_io.save_file({f"{t}.{s}.0": torch.zeros(8, 2000) for t in "xy"
                                      for s in range(3)}, path)
            args, _ = torch_ddp.parse_args(["--batch-size", "5", "--grad-accum", "4",
                                            "--inputs", path])
            batches, warmup, repeat = torch_ddp.step_batches(args, data_rank=0)
            self.assertEqual([x.shape[0] for x, _ in batches], [8, 8, 8])
            self.assertEqual((warmup, repeat), (0, 3))
        # 3 micro-batches of 5: the split that the per-step meaning refused (5 % 3) runs.
        proc = run_reference("--model", "mlp-deep", "--batch-size", "5", "--grad-accum", "3",
                             "--repeat", "1", "--warmup", "0", "--json")
        # stdout is the JSON object alone; the mean latency line is on stderr.
        self.assertEqual(len(proc.stdout.strip().splitlines()), 1, proc.stdout)
        fields = json.loads(proc.stdout.strip().splitlines()[-1])
        self.assertEqual(fields["batch"], 5)

    def test_grad_accum_that_does_not_divide_an_inputs_batch_is_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "inputs.safetensors")
            safetensors_io.save_file({"x.0.0": torch.zeros(8, 2000), "y.0.0": torch.zeros(8, 2000)},
                                     path)
            r = subprocess.run([sys.executable, SCRIPT, "--model", "toy", "--inputs", path,
                                "--grad-accum", "3"],
                               capture_output=True, text=True, timeout=120, cwd=ROOT)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(f"--grad-accum 3 does not divide the per-rank batch of 8 in --inputs {path} "
                      "into equal micro-batches", r.stderr)

    def test_bad_recipe_flags_are_parser_errors(self):
        for flags, want in [
                (["--grad-clip", "-1"], "--grad-clip must be >= 0 (0: off), got -1.0"),
                (["--grad-accum", "0"], "--grad-accum must be >= 1, got 0"),
                (["--lr-decay", "linear"], "a linear decay needs --lr-decay-steps"),
                (["--warmup-steps", "5", "--lr-decay-steps", "3"],
                 "--warmup-steps (5) must not exceed --lr-decay-steps (3)"),
                (["--device", "cuda", "--cuda-graph", "--warmup-steps", "2"],
                 "--cuda-graph with an lr schedule and --optimizer sgd needs --optim-impl fused: "
                 "torch's default SGD reads the learning rate on the host, so a captured step "
                 "would replay one rate (use adam/adamw, or a constant --lr)"),
                (["--dp-replicate", "2"], "--dp-replicate R needs --fsdp and R >= 1")]:
            with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()) as err:
                torch_ddp.parse_args(flags)
            self.assertIn(want, err.getvalue())

    def test_defaults_are_plain_sgd_at_a_constant_rate(self):
        args, _ = torch_ddp.parse_args([])
        self.assertEqual((args.optimizer, args.grad_clip, args.grad_accum, args.lr_decay),
                         ("sgd", 0.0, 1, "constant"))
        self.assertFalse(torch_ddp.scheduled(args))
        args, _ = torch_ddp.parse_args(["--lr", "0.5", "--lr-decay-steps", "10"])
        self.assertEqual((args.lr_decay, args.min_lr), ("cosine", 0.05))


class CapturedRecipeTest(unittest.TestCase):
    """--cuda-graph runs the whole recipe (recipe.recipe_step inside torch.cuda.graph) and
    --optim-impl picks torch.optim's implementation. The capture itself needs CUDA (checked on the
    GPU machine: captured and eager parameters equal); here, on any torch, what can run without it."""

    RECIPE = ["--optimizer", "adamw", "--grad-clip", "1", "--grad-accum", "2", "--warmup-steps",
              "2", "--lr-decay-steps", "10"]

    def test_cuda_graph_takes_the_whole_recipe(self):
        for flags in (["--cuda-graph", *self.RECIPE],
                      ["--device", "cuda", "--cuda-graph", *self.RECIPE],
                      ["--device", "cuda", "--cuda-graph", "--optimizer", "adam", "--lr-decay",
                       "linear", "--lr-decay-steps", "5"],
                      ["--device", "cuda", "--cuda-graph", "--grad-accum", "4", "--grad-clip", "1"]):
            args, _ = torch_ddp.parse_args(flags)
            self.assertIsNone(torch_ddp.recipe_error(args), flags)

    def test_fused_on_the_cpu_is_refused_by_exact_text(self):
        if recipe._torch_at_least(2, 4):
            self.skipTest(f"torch {torch.__version__} has fused CPU optimizers")
        r = subprocess.run([sys.executable, SCRIPT, "--optim-impl", "fused", "--device", "cpu",
                            "--optimizer", "adamw"], capture_output=True, text=True, timeout=120,
                           cwd=ROOT)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(f"torch_ddp.py: error: --optim-impl fused needs --device cuda with torch "
                      f"{torch.__version__}: its fused optimizers are CUDA kernels (the CPU ones "
                      f"came in torch 2.4); use --optim-impl foreach or default", r.stderr)

    def test_implementation_defaults_and_what_reaches_the_optimizer(self):
        def impl(*flags):
            return torch_ddp.parse_args(list(flags))[0].optim_impl

        self.assertEqual(impl("--optimizer", "adamw"), "default")  # the CPU parity's update
        self.assertEqual(impl("--device", "cuda"), "default")  # SGD as always
        fused = "fused" if recipe._takes(torch.optim.AdamW, "fused") else "default"
        self.assertEqual(impl("--device", "cuda", "--optimizer", "adamw"), fused)
        self.assertEqual(impl("--device", "cuda", "--optimizer", "adamw", "--optim-impl", "foreach"),
                         "foreach")
        model = zoo.build_model("toy")
        for flags, foreach in ((["--optimizer", "adamw", "--optim-impl", "foreach"], True),
                               (["--optimizer", "adam"], None),
                               (["--optim-impl", "foreach"], True)):
            opt = torch_ddp.make_optimizer(model, torch_ddp.parse_args(flags)[0])
            self.assertEqual(opt.defaults["foreach"], foreach, flags)
            self.assertFalse(opt.defaults.get("fused") or opt.defaults.get("capturable"), flags)

    def test_verbose_names_the_implementation(self):
        args, _ = torch_ddp.parse_args(["--device", "cuda", "--cuda-graph", "--optimizer", "adamw",
                                        "--beta2", "0.95", "--grad-clip", "1"])
        self.assertEqual(torch_ddp.describe_recipe(args),
                         f"optimizer adamw ({args.optim_impl}, capturable, betas 0.9/0.95, eps 1e-8, "
                         f"weight decay 0.1 on dim >= 2), lr 0.01 (a device tensor, set before each "
                         f"replay), grad clip 1, grad accum 1")
        args, _ = torch_ddp.parse_args(["--optimizer", "adam", "--optim-impl", "foreach"])
        self.assertEqual(torch_ddp.describe_recipe(args),
                         "optimizer adam (foreach, betas 0.9/0.999, eps 1e-8), lr 0.01, no grad clip, "
                         "grad accum 1")
        args, _ = torch_ddp.parse_args(["--device", "cuda", "--cuda-graph"])
        self.assertEqual(torch_ddp.describe_recipe(args),
                         "optimizer sgd (default, momentum 0), lr 0.01, no grad clip, grad accum 1")

    def test_set_lr_fills_the_shared_tensor_in_place(self):
        model = zoo.build_model("toy")
        args, _ = torch_ddp.parse_args(["--optimizer", "adamw"])
        opt = torch_ddp.make_optimizer(model, args)
        lr = torch.tensor(0.5)
        for group in opt.param_groups:
            group["lr"] = lr
        torch_ddp.set_lr(opt, 0.125)
        # The same tensor (a captured step holds its address), now holding the new rate.
        self.assertTrue(all(g["lr"] is lr for g in opt.param_groups))
        self.assertEqual(lr.item(), 0.125)
        plain = torch_ddp.make_optimizer(model, torch_ddp.parse_args([])[0])
        torch_ddp.set_lr(plain, 0.25)
        self.assertEqual([g["lr"] for g in plain.param_groups], [0.25])

    def test_only_the_last_micro_batch_synchronizes(self):
        torch.manual_seed(0)
        model = zoo.build_model("toy")
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        x, y = zoo.random_batch("toy", 6)
        for accum, want in ((3, [False, False, True]), (2, [False, True]), (1, [])):
            calls = []

            def grad_sync(last):
                calls.append(last)
                return contextlib.nullcontext()

            opt.zero_grad(set_to_none=True)
            recipe.recipe_step(model, opt, zoo.loss_fn("toy"), x, y, accum=accum,
                               grad_sync=grad_sync)
            self.assertEqual(calls, want, f"accum {accum}")

    def test_recipe_step_equals_the_eager_path(self):
        # The captured step's body, run eagerly on the CPU the way the capture drives it (gradients
        # set to None, the rate written into one lr tensor before each step), ends where the
        # script's eager path does: AdamW in two groups, 2 micro-batches, a clip, a schedule.
        model = "mlp-deep"
        with tempfile.TemporaryDirectory() as tmp:
            init, f = mlp_deep_run_files(tmp, steps=3, seed=2, outputs=("eager",))
            flags = ["--model", model, "--lr", "1e-3", "--optimizer", "adamw", "--grad-clip", "0.5",
                     "--grad-accum", "2", "--warmup-steps", "1", "--lr-decay-steps", "2"]
            run_reference(*flags, "--init-params", f["init"], "--inputs", f["inputs"],
                          "--save-params", f["eager"])
            eager = safetensors_io.load_file(f["eager"])

            args, _ = torch_ddp.parse_args(flags)
            net = zoo.build_model(model)
            torch_ddp.load_params(net, f["init"])
            opt = torch_ddp.make_optimizer(net, args)
            lr = torch.tensor(args.lr)  # what --cuda-graph puts on the device
            for group in opt.param_groups:
                group["lr"] = lr
            lossf = zoo.loss_fn(model)
            batches = torch_ddp.load_inputs(f["inputs"], 0, torch.device("cpu"))
        self.assertEqual(len(batches), 3)
        for step, (x, y) in enumerate(batches):
            opt.zero_grad(set_to_none=True)
            torch_ddp.set_lr(opt, torch_ddp.lr_at(step, args.lr, args.min_lr, args.warmup_steps,
                                                  args.lr_decay_steps, args.lr_decay))
            recipe.recipe_step(net, opt, lossf, x, y, accum=2, grad_clip=0.5)
        self.assertAlmostEqual(lr.item(), args.min_lr, delta=1e-10)  # step 2 is the decay's end
        for name, p in net.named_parameters():
            self.assertGreater(rel_diff(eager[name], init[name]), 0, f"{name} did not move")
            self.assertLess(rel_diff(p.detach(), eager[name]), 1e-6, name)


class RunTest(unittest.TestCase):
    def test_result_lines_text_and_json(self):
        proc = run_reference("--model", "mlp-deep", "--batch-size", "4", "--repeat", "2", "--warmup", "1",
                             "--no-graph-planning", "--graph-dot", "g.dot")
        lines = proc.stdout.strip().splitlines()
        self.assertRegex(lines[-2], r"^result model=mlp-deep world=1 batch=4 device=cpu side=pytorch "
                                    r"median_ms=\d+\.\d{3} mean_ms=\d+\.\d{3} min_ms=\d+\.\d{3} repeat=2$")
        self.assertRegex(lines[-1], r"^mean latency \d+\.\d{3} ms across 2 runs$")
        self.assertIn("--no-graph-planning", proc.stderr)  # accepted, reported as ignored
        proc = run_reference("--model", "mlp-deep", "--batch-size", "4", "--repeat", "2", "--json",
                             "--ddp", "--nproc", "2")
        # stdout is the JSON object alone; the mean latency line is on stderr.
        self.assertEqual(len(proc.stdout.strip().splitlines()), 1, proc.stdout)
        fields = json.loads(proc.stdout.strip().splitlines()[-1])
        self.assertEqual((fields["world"], fields["side"], fields["repeat"]), (2, "pytorch", 2))
        # Each rank's initialisation, as ddp-bench's: seconds, and a resident peak holding at least
        # the whole model under DDP.
        self.assertEqual((len(fields["init_s"]), len(fields["init_peak_bytes"])), (2, 2))
        self.assertTrue(all(s > 0 for s in fields["init_s"]), fields["init_s"])
        self.assertTrue(all(b >= fields["memory"]["param_bytes"] for b in fields["init_peak_bytes"]))
        self.assertRegex(proc.stderr.strip().splitlines()[-1], r"^mean latency ")

    def test_ddp_equals_single_process_on_the_concatenated_batch(self):
        # The equivalence DDP promises (loss is a mean over the batch): 2 ranks x 4 samples for
        # 2 steps match one process on the 8 samples. Also: two identical runs give identical bytes.
        torch.manual_seed(0)
        model = "mlp-deep"
        init = {n: p.detach() for n, p in torch_ddp.build_model(model).named_parameters()}
        gen = torch.Generator().manual_seed(1)
        per_rank, joined = {}, {}
        for step in range(2):
            xs, ys = [], []
            for rank in range(2):
                x, y = torch_ddp.random_batch(model, 4, gen)
                per_rank[f"x.{step}.{rank}"], per_rank[f"y.{step}.{rank}"] = x, y / 512 ** 0.5
                xs.append(x)
                ys.append(y / 512 ** 0.5)
            joined[f"x.{step}.0"], joined[f"y.{step}.0"] = torch.cat(xs), torch.cat(ys)
        with tempfile.TemporaryDirectory() as tmp:
            f = {k: os.path.join(tmp, k + ".safetensors") for k in ("init", "ranks", "joined", "a", "b", "one")}
            safetensors_io.save_file(init, f["init"])
            safetensors_io.save_file(per_rank, f["ranks"])
            safetensors_io.save_file(joined, f["joined"])
            common = ["--model", model, "--init-params", f["init"], "--lr", "0.05"]
            run_reference(*common, "--ddp", "--nproc", "2", "--inputs", f["ranks"], "--save-params", f["a"])
            run_reference(*common, "--ddp", "--nproc", "2", "--inputs", f["ranks"], "--save-params", f["b"])
            run_reference(*common, "--inputs", f["joined"], "--save-params", f["one"])
            a, b, one = (safetensors_io.load_file(f[k]) for k in ("a", "b", "one"))
        self.assertEqual(list(a), list(init))
        for name in init:
            self.assertTrue(torch.equal(a[name], b[name]), f"{name}: two identical runs differ")
            self.assertGreater(rel_diff(a[name], init[name]), 0, f"{name} did not move")
            # Equal up to 1e-5 of the update, or fp32 resolution of the parameter where the update
            # is smaller than that (mlp-deep's first layers move by ~1e-7 of their norm).
            err = (a[name].double() - one[name].double()).norm().item()
            update = (one[name].double() - init[name].double()).norm().item()
            floor = 1.2e-7 * init[name].double().norm().item()
            self.assertLessEqual(err, 1e-5 * update + floor, f"{name}: err {err:.3g}, update {update:.3g}")


if __name__ == "__main__":
    unittest.main()
