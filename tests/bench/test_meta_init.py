#!/usr/bin/python3
"""torch_ddp.py --meta-init (FSDP2's large-model path: built on the meta device, sharded, to_empty,
then zoo.init_weights on the shards): init_weights writes every value the constructor writes, with
its fixed values equal and its draws from the same distributions; on a torch without the meta
device as a context the flag is refused by name. The path itself runs on torch 2.x GPUs
(scripts/gpu-check.sh llama with LLAMA_META=1).

    /usr/bin/python3 -m unittest discover -s tests/bench -v
"""

import contextlib
import io
import itertools
import subprocess
import sys
import unittest

import torch

from bench_support import SCRIPT  # noqa: E402  (sets sys.path to bench/reference)
import torch_ddp  # noqa: E402
import zoo  # noqa: E402


def values(model):
    return dict(itertools.chain(model.named_parameters(), model.named_buffers()))


class MetaInitTest(unittest.TestCase):

    def test_init_weights_writes_every_value_the_constructor_writes(self):
        for name in ("gpt-tiny", "llama-tiny"):
            torch.manual_seed(3)
            built = zoo.build_model(name)
            model = zoo.build_model(name)
            with torch.no_grad():  # what to_empty leaves: anything
                for t in values(model).values():
                    t.fill_(float("nan"))
            torch.manual_seed(7)
            zoo.init_weights(model)
            expected = values(built)
            for key, t in values(model).items():
                self.assertFalse(torch.isnan(t).any().item(), f"{name}: {key} not written")
                if t.dim() == 2 and not key.endswith(("rope_cos", "rope_sin")):
                    # A weight ~ N(0, 0.02), as the constructor's: mean and deviation to 4 sigma.
                    n = t.numel()
                    self.assertLess(abs(t.mean().item()), 4 * 0.02 / n ** 0.5, f"{name}: {key}")
                    self.assertLess(abs(t.std().item() - 0.02), 4 * 0.02 / (2 * n) ** 0.5,
                                    f"{name}: {key}")
                else:  # norms, biases, the rotary tables: the constructor's values exactly
                    self.assertTrue(torch.equal(t, expected[key]), f"{name}: {key}")
            again = zoo.build_model(name)
            torch.manual_seed(7)
            zoo.init_weights(again)
            for key, t in values(again).items():
                self.assertTrue(torch.equal(t, values(model)[key]), f"{name}: {key} not seeded")

    def test_refused_for_other_models_and_without_the_meta_device(self):
        with self.assertRaises(ValueError) as refused:
            zoo.init_weights(zoo.build_model("mlp-deep"))
        self.assertEqual(str(refused.exception), "init_weights: a GPT or Llama model, got MLP")
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()) as err:
            torch_ddp.parse_args(["--model", "mlp-deep", "--meta-init"])
        self.assertIn("--meta-init needs a GPT or Llama model, without --init-params or --tp",
                      err.getvalue())
        if hasattr(torch.device, "__enter__"):
            return  # torch >= 2.0: the path runs (on GPUs, scripts/gpu-check.sh)
        proc = subprocess.run([sys.executable, SCRIPT, "--model", "gpt-tiny", "--meta-init",
                               "--repeat", "1", "--warmup", "0"], capture_output=True, text=True,
                              timeout=120)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn(f"torch_ddp.py: --meta-init needs torch >= 2.0 (the meta device as a "
                      f"context); this is torch {torch.__version__}", proc.stderr + proc.stdout)


if __name__ == "__main__":
    unittest.main()
