"""Every SVG the project ships or writes is well-formed XML (a browser shows an error page instead
of a picture that is not): the shipped files under the tree, bench/trace_attribution.py's pictures
of kernels whose names hold '<' and '&' where its 80-character cut falls, and, with DDP_BUILD_DIR
set (CTest sets it), the loss plot of ddp-train and the timeline of trace-svg."""
import json
import os
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import trace_attribution  # noqa: E402


def shipped_svgs():
    for top, dirs, files in os.walk(ROOT):
        # Build trees and version control are not shipped.
        dirs[:] = [d for d in dirs if not d.startswith(("build", ".")) and d != "node_modules"]
        for f in files:
            if f.endswith(".svg"):
                yield os.path.join(top, f)


class Svgs(unittest.TestCase):
    def assert_parses(self, path):
        try:
            root = ET.parse(path).getroot()
        except ET.ParseError as e:
            self.fail(f"{path} is not well-formed XML: {e}")
        self.assertTrue(root.tag.endswith("svg"), f"{path}: root element {root.tag}")

    def test_every_shipped_svg_parses(self):
        found = list(shipped_svgs())
        self.assertTrue(any(p.endswith(os.path.join("docs", "loss.svg")) for p in found), found)
        for path in found:
            self.assert_parses(path)

    def test_check_finds_a_broken_svg(self):
        # The check above can fail: a name cut inside an entity, as the old drawing wrote it.
        with tempfile.TemporaryDirectory() as d:
            bad = os.path.join(d, "bad.svg")
            with open(bad, "w") as f:
                f.write('<svg xmlns="http://www.w3.org/2000/svg"><title>a &lt</title></svg>')
            with self.assertRaises(AssertionError):
                self.assert_parses(bad)

    def test_trace_attribution_draws_hostile_kernel_names(self):
        # '<' at index 79 and '&' at 78: escaping before the 80-character cut split "&lt;".
        names = ["x" * 79 + "<int, 4>", "y" * 78 + "&<&>", "ncclDevKernel_AllReduce<&>"]
        events = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": i,
                   "dur": 1, "args": {"correlation": i + 1}} for i in range(len(names))]
        events += [{"ph": "X", "cat": "kernel", "name": n, "ts": 10 + 20 * i, "dur": 15,
                    "args": {"correlation": i + 1, "stream": 7 if i < 2 else 20}}
                   for i, n in enumerate(names)]
        events.insert(0, {"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize",
                          "ts": -5, "dur": 1, "args": {"correlation": 99}})
        _, _, kernels, ref = trace_attribution.analyze(events, step_index=1)
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "trace.svg")
            trace_attribution.svg(kernels, ref, out)
            self.assert_parses(out)
            titles = [t.text for t in ET.parse(out).getroot().iter("{http://www.w3.org/2000/svg}title")]
            self.assertIn("x" * 79 + "< 0.015 ms", titles)

    @unittest.skipUnless(os.environ.get("DDP_BUILD_DIR"), "DDP_BUILD_DIR names the built tools")
    def test_the_tools_pictures_parse(self):
        build = os.environ["DDP_BUILD_DIR"]
        with tempfile.TemporaryDirectory() as d:
            plot = os.path.join(d, "loss.svg")
            subprocess.run([os.path.join(build, "ddp-train"), "--model", "net", "--steps", "4",
                            "--plot", plot], check=True, capture_output=True, timeout=300)
            self.assert_parses(plot)
            trace = os.path.join(d, "profile.json")
            subprocess.run([os.path.join(build, "ddp-bench"), "--model", "toy", "--ddp",
                            "--nproc", "2", "--repeat", "2", "--warmup", "1", "--profile",
                            "--trace-file", trace], check=True, capture_output=True, timeout=300)
            timeline = os.path.join(d, "timeline.svg")
            subprocess.run([os.path.join(build, "trace-svg"), trace, "-o", timeline], check=True,
                           capture_output=True, timeout=300)
            self.assert_parses(timeline)


if __name__ == "__main__":
    unittest.main()
