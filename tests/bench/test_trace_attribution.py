"""bench/trace_attribution.py on hand-made Kineto traces: the numbers are closed forms."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "bench", "trace_attribution.py")
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
import trace_attribution  # noqa: E402


def kernel(name, ts, dur, corr, stream):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "stream": stream}}


def launch(ts, corr, name="cudaLaunchKernel"):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": 1,
            "args": {"correlation": corr}}


def eager_step(t, corr):
    """One eager step after a device synchronization ending at host time t (us): forward kernel,
    two backward kernels, one all-reduce, one optimizer kernel. GPU times are offsets from
    t + 10."""
    g = t + 10
    return [
        launch(t - 1, corr + 9, "cudaDeviceSynchronize"),
        launch(t + 1, corr), kernel("fwd_gemm", g, 100, corr, 7),
        launch(t + 6, corr + 1), kernel("bwd_gemm", g + 100, 100, corr + 1, 7),
        launch(t + 7, corr + 2), kernel("ncclDevKernel_AllReduce", g + 150, 120, corr + 2, 20),
        launch(t + 8, corr + 3), kernel("bwd_gemm2", g + 200, 50, corr + 3, 7),
        launch(t + 11, corr + 4), kernel("sgd", g + 270, 10, corr + 4, 7),
    ]


class TraceAttribution(unittest.TestCase):
    def test_eager_step_closed_form(self):
        events = eager_step(0, 1) + eager_step(1000, 20) + eager_step(2000, 40)
        summary, rows, _, _ = trace_attribution.analyze(events)
        self.assertEqual(summary["kind"], "eager")
        self.assertEqual(summary["step"], 2)  # the middle of 3 (step 0: before the first sync)
        # The all-reduce runs [150, 270) after the step's GPU start; compute is busy [0, 250):
        # 100 of its 120 us hide, 20 stay exposed; backward's last compute kernel ends at 250.
        self.assertEqual(len(rows), 1)
        self.assertAlmostEqual(rows[0]["dur_ms"], 0.120)
        self.assertAlmostEqual(rows[0]["hidden_ms"], 0.100)
        self.assertAlmostEqual(rows[0]["start_ms"], -0.100)
        self.assertAlmostEqual(rows[0]["end_ms"], 0.020)
        self.assertAlmostEqual(summary["nccl_exposed_ms"], 0.020)
        self.assertAlmostEqual(summary["tail_after_backward_ms"], 0.020)
        self.assertAlmostEqual(summary["step_gpu_ms"], 0.280)
        self.assertAlmostEqual(summary["compute_busy_ms"], 0.260)

    def test_captured_steps_split_by_graph_launch(self):
        events = []
        for k, t in enumerate((0, 1000)):
            corr = 100 + k
            events.append(launch(t, corr, "cudaGraphLaunch"))
            g = t + 10
            events += [kernel("gemm", g, 200, corr, 7),
                       kernel("ncclDevKernel_AllReduce", g + 100, 150, corr, 20)]
        summary, rows, _, _ = trace_attribution.analyze(events, step_index=0)
        self.assertEqual(summary["kind"], "captured")
        self.assertEqual(summary["steps"], 2)
        self.assertAlmostEqual(rows[0]["hidden_ms"], 0.100)
        self.assertAlmostEqual(summary["nccl_exposed_ms"], 0.050)

    def test_without_host_ops_steps_split_at_device_synchronizations(self):
        events = []
        for k, t in enumerate((0, 1000, 2000)):
            corr = 10 * (k + 1)
            sync = launch(t - 5, corr + 9, "cudaDeviceSynchronize")
            events += [sync, launch(t, corr), kernel("gemm", t + 10, 200, corr, 7),
                       launch(t + 2, corr + 1),
                       kernel("ncclDevKernel_AllReduce", t + 110, 130, corr + 1, 20)]
        summary, rows, _, _ = trace_attribution.analyze(events)
        self.assertEqual(summary["kind"], "eager")
        self.assertEqual(summary["nccl_kernels"], 1)
        # gemm [10, 210), all-reduce [110, 240): 100 of 130 hidden, 30 after backward's compute.
        self.assertAlmostEqual(rows[0]["hidden_ms"], 0.100)
        self.assertAlmostEqual(summary["tail_after_backward_ms"], 0.030)

    def test_command_line_prints_the_table_and_draws(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trace.json")
            with open(path, "w") as f:
                json.dump({"traceEvents": eager_step(0, 1)}, f)
            svg = os.path.join(d, "step.svg")
            out = subprocess.run([sys.executable, SCRIPT, path, "--svg", svg], check=True,
                                 capture_output=True, text=True).stdout
            self.assertIn("nccl_exposed_ms=0.020", out)
            self.assertIn("ncclDevKernel_AllReduce", out)
            with open(svg) as f:
                self.assertIn("<svg", f.read())

    def test_idle_gaps_are_named_by_cause(self):
        # Compute [10, 110) launched at 1; [130, 150) launched at 125, after the gap began (host);
        # [170, 200) launched at 3 while an all-reduce ran [150, 165) (nccl); [210, 220) launched
        # at 4, nothing in between (waiting).
        events = [launch(-5, 99, "cudaDeviceSynchronize"),
                  launch(1, 1), kernel("gemm_a", 10, 100, 1, 7),
                  launch(125, 2), kernel("vectorized_elementwise_kernel", 130, 20, 2, 7),
                  launch(2, 3), kernel("ncclDevKernel_AllReduce", 150, 15, 3, 20),
                  launch(3, 4), kernel("layer_norm_kernel", 170, 30, 4, 7),
                  launch(4, 5), kernel("multi_tensor_apply_kernel<Copy<float>>", 210, 10, 5, 7)]
        summary, _, _, _ = trace_attribution.analyze(events, step_index=1)
        gaps = summary["gaps"]
        self.assertEqual([g["why"] for g in gaps], ["host", "nccl", "waiting"])
        self.assertAlmostEqual(summary["gaps_host_ms"], 0.020)
        self.assertAlmostEqual(summary["gaps_nccl_ms"], 0.020)
        self.assertAlmostEqual(summary["gaps_waiting_ms"], 0.010)
        self.assertEqual(gaps[0]["after"], "gemm_a")
        self.assertEqual(gaps[0]["before"], "vectorized_elementwise_kernel")
        classes = summary["classes"]
        self.assertAlmostEqual(classes["gemm"], 0.100)
        self.assertAlmostEqual(classes["elementwise"], 0.020)
        self.assertAlmostEqual(classes["layernorm"], 0.030)
        self.assertAlmostEqual(classes["foreach copy"], 0.010)
        self.assertNotIn("comm", classes)  # NCCL kernels are not compute
        # Compute launches at 1, 3, 4, 125: intervals 1, 2, 121 us; the median is 2.
        self.assertAlmostEqual(summary["host_launch_interval_us"], 2.0)

    def test_baseline_prints_the_slowdown_by_class(self):
        with tempfile.TemporaryDirectory() as d:
            traces = []
            for name, dur in (("one.json", 100), ("many.json", 130)):
                path = os.path.join(d, name)
                events = [launch(-5, 99, "cudaDeviceSynchronize"), launch(1, 1),
                          kernel("sm90_xmma_gemm", 10, dur, 1, 7)]
                with open(path, "w") as f:
                    json.dump({"traceEvents": events}, f)
                traces.append(path)
            out = subprocess.run([sys.executable, SCRIPT, traces[1], "--baseline", traces[0],
                                  "--step", "1"], check=True, capture_output=True, text=True).stdout
            self.assertRegex(out, r"gemm\s+0\.130\s+0\.100\s+\+0\.030")

    def test_a_trace_without_steps_is_refused(self):
        with self.assertRaises(SystemExit) as e:
            trace_attribution.analyze([kernel("gemm", 0, 1, 1, 7)])
        self.assertIn("no steps or no GPU kernels", str(e.exception))


if __name__ == "__main__":
    unittest.main()
