"""bench/scaling_table.py on a hand-made summary: medians, scaling and ratios in closed form."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "bench", "scaling_table.py")
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
import scaling_table  # noqa: E402

SUMMARY = """machine: 4 GPUs; worlds: 1 2 4
final m round 1 ours-1gpu: 50.0 ms
final m round 1 ours-ddp-w2: 52.0 ms
final m round 1 torch-ddp-w2: 60.0 ms
final m round 1 torch-ddp-tuned-w2: 55.0 ms
final m round 1 ours-ddp-w4: 53.0 ms
final m round 2 ours-1gpu: 48.0 ms
final m round 2 ours-ddp-w2: 48.0 ms
final m round 2 torch-ddp-w2: 60.0 ms
final m round 2 torch-ddp-tuned-w2: 45.0 ms
final m round 2 ours-ddp-w4: 47.0 ms
final m round 3 ours-1gpu: 49.0 ms
final m round 3 ours-ddp-w2: 50.0 ms
final m round 3 torch-ddp-w2: 40.0 ms
final m round 3 torch-ddp-tuned-w2: 50.0 ms
final m round 3 ours-ddp-w4: 50.0 ms
lever gpt2-medium world 4 round 1 default: 60.0 ms
"""


class ScalingTable(unittest.TestCase):
    def test_medians_scaling_and_ratios(self):
        models = scaling_table.parse(SUMMARY.splitlines())
        self.assertEqual(list(models), ["m"])  # the lever line is not a final line
        text = scaling_table.table("m", models["m"])
        # Medians: one GPU 49, ours w2 50, PyTorch 60, tuned 50, ours w4 50; 49 / 50 = 98.0%.
        self.assertIn("| 2 | 49.00 | 50.00 | 60.00 | 50.00 | - | 98.0% | 0.833 | 1.000 | - |", text)
        self.assertIn("| 4 | 49.00 | 50.00 | - | - | - | 98.0% | - | - | - |", text)
        self.assertIn("over 3 rounds", text)

    def test_command_line_refuses_a_summary_without_final_lines(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "summary.txt")
            with open(path, "w") as f:
                f.write("lever gpt2-medium world 4 round 1 default: 60.0 ms\n")
            run = subprocess.run([sys.executable, SCRIPT, path], capture_output=True, text=True)
            self.assertNotEqual(run.returncode, 0)
            self.assertIn("no 'final <model> round <k> <side>: <ms> ms' lines", run.stderr)


if __name__ == "__main__":
    unittest.main()
