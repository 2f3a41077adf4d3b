#!/usr/bin/python3
"""--fsdp's knobs in bench/reference/torch_fsdp.py (FSDP2's fully_shard, checkpoint_wrapper,
prefetch lists), on any torch: fully_shard is faked where the torch has none. No C++ build needed.

    /usr/bin/python3 -m unittest discover -s tests/bench -v
"""

import contextlib
import io
import sys
import types
import unittest
from unittest import mock

import torch

from bench_support import rel_diff  # noqa: E402  (sets sys.path to bench/reference)
import torch_ddp  # noqa: E402
import torch_fsdp  # noqa: E402
import zoo  # noqa: E402


class FullyShardFlagsTest(unittest.TestCase):
    """--fsdp's knobs (torch_fsdp.py) on any torch: the refusals, what reaches fully_shard (a
    stand-in records it), the prefetch lists. FSDP2 itself runs in scripts/gpu-check.sh fsdpbest."""

    def test_knobs_without_what_they_need_are_parser_errors(self):
        for flags, want in [
                (["--reshard-after-forward", "false"], "--reshard-after-forward false needs --fsdp"),
                (["--fsdp", "--reshard-after-forward", "root-false"],
                 "--reshard-after-forward root-false needs --fsdp-wrap: without it the root is the "
                 "only unit (use false)"),
                (["--fsdp", "--fsdp-prefetch", "1"],
                 "--fsdp-prefetch needs --fsdp --fsdp-wrap: it prefetches blocks, and without "
                 "--fsdp-wrap the root is the only unit"),
                (["--fsdp", "--fsdp-wrap", "--fsdp-prefetch", "-1"],
                 "--fsdp-prefetch must be >= 0 (0: FSDP2's implicit prefetch), got -1")]:
            with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()) as err:
                torch_ddp.parse_args(flags)
            self.assertIn(want, err.getvalue())

    @staticmethod
    def shard(flags, checkpoint=False, name="gpt-tiny"):
        """make_fsdp on the zoo's `name` with a stand-in FSDP2: [(module, kwargs)] in call order;
        with `checkpoint`, its blocks checkpointed first (as torch_ddp.py does for
        --fsdp-checkpoint)."""
        calls = []

        def fully_shard(module, **kwargs):
            calls.append((module, kwargs))
            module.set_modules_to_forward_prefetch = lambda m, u=module: setattr(u, "fwd", m)
            module.set_modules_to_backward_prefetch = lambda m, u=module: setattr(u, "bwd", m)

        fake = types.ModuleType("torch.distributed.fsdp")
        fake.fully_shard, fake.MixedPrecisionPolicy = fully_shard, lambda **kw: kw
        args, _ = torch_ddp.parse_args(["--model", name, "--fsdp", *flags])
        model = zoo.build_model(name)
        if checkpoint:
            torch_fsdp.checkpoint_blocks(model)
        with mock.patch.dict(sys.modules, {"torch.distributed.fsdp": fake}):
            torch_fsdp.make_fsdp(model, args)
        return model, calls

    def test_defaults_pass_fully_shard_nothing_as_before(self):
        model, calls = self.shard(["--fsdp-wrap"])
        self.assertEqual([m for m, _ in calls], [*model.h, model])  # blocks first, then the root
        self.assertEqual([kw for _, kw in calls], [{}] * 5)
        self.assertFalse(any(hasattr(b, "fwd") or hasattr(b, "bwd") for b in model.h))

    def test_each_mode_reaches_the_blocks_and_the_root(self):
        for mode, blocks, root in [("true", True, True), ("false", False, False),
                                   ("root-false", True, False)]:
            model, calls = self.shard(["--fsdp-wrap", "--reshard-after-forward", mode])
            self.assertEqual([kw["reshard_after_forward"] for _, kw in calls], [blocks] * 4 + [root])
        _, calls = self.shard(["--fsdp-wrap", "--param-dtype", "bf16", "--reduce-dtype", "fp32"])
        self.assertEqual(calls[-1][1], {"mp_policy": {"param_dtype": torch.bfloat16,
                                                      "reduce_dtype": torch.float32}})

    def test_checkpoint_wraps_every_block_and_changes_no_gradient(self):
        # --fsdp-checkpoint (issue 59's FSDP2 side): every GPT block becomes a non-reentrant
        # CheckpointWrapper that fully_shard then takes as the unit; the gradients equal those of
        # the plain model, and the saved names are the plain model's.
        torch.manual_seed(0)
        plain = zoo.build_model("gpt-tiny")
        wrapped = zoo.build_model("gpt-tiny")
        wrapped.load_state_dict(plain.state_dict())
        self.assertEqual(torch_fsdp.checkpoint_blocks(wrapped), 4)
        self.assertTrue(all(type(b).__name__ == "CheckpointWrapper" for b in wrapped.h))
        self.assertEqual([torch_fsdp.unwrapped_name(n) for n, _ in wrapped.named_parameters()],
                         [n for n, _ in plain.named_parameters()])
        x, y = zoo.random_batch("gpt-tiny", 2, torch.Generator().manual_seed(1))
        lossf = zoo.loss_fn("gpt-tiny")
        for m in (plain, wrapped):
            lossf(m(x), y).backward()
        for (name, p), (_, q) in zip(plain.named_parameters(), wrapped.named_parameters()):
            self.assertLess(rel_diff(q.grad, p.grad), 1e-5, name)
        model, calls = self.shard(["--fsdp-wrap", "--fsdp-checkpoint"], checkpoint=True)
        self.assertEqual([m for m, _ in calls], [*model.h, model])
        self.assertTrue(all(type(b).__name__ == "CheckpointWrapper" for b in model.h))

    def test_an_untied_llama_shards_its_embedding_and_output_as_units_as_ours_does(self):
        # models/src/registry.cpp's wrap units: tok_embeddings, the layers, output; only the layers
        # are checkpointed. Tied, the shared weight stays in the root.
        model, calls = self.shard(["--fsdp-wrap", "--fsdp-checkpoint"], checkpoint=True,
                                  name="llama-tiny")
        self.assertEqual([m for m, _ in calls],
                         [model.tok_embeddings, *model.layers, model.output, model])
        self.assertTrue(all(type(b).__name__ == "CheckpointWrapper" for b in model.layers))
        self.assertEqual(type(model.output).__name__, "Linear")
        tied = zoo.Llama(vocab_size=64, seq_len=16, d_model=32, n_layers=2, n_heads=4,
                         n_kv_heads=2, ffn_hidden=64, tie_weights=True)
        self.assertEqual(torch_fsdp.units_of(tied), list(tied.layers))

    def test_prefetch_lists_are_the_neighbours_nearest_first(self):
        model, _ = self.shard(["--fsdp-wrap", "--fsdp-prefetch", "2"])
        h = list(model.h)
        self.assertEqual([getattr(b, "fwd", None) for b in h], [h[1:3], h[2:4], h[3:4], None])
        self.assertEqual([getattr(b, "bwd", None) for b in h], [None, [h[0]], [h[1], h[0]], [h[2], h[1]]])
        self.assertEqual(torch_fsdp.prefetch_plan(3, 5), ({0: [1, 2], 1: [2]}, {1: [0], 2: [1, 0]}))
        self.assertEqual(torch_fsdp.prefetch_plan(4, 0), ({}, {}))


if __name__ == "__main__":
    unittest.main()
