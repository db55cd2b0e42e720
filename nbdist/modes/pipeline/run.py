"""The Run of a pipeline: a `Run` that also shows what was measured (`profile`), how the model
was cut (`partition`, with each stage's predicted and measured time), and how the stages
spent each step (`pipeline`: the timeline, bubble fraction and utilisation)."""

from __future__ import annotations

import pandas as pd

from nbdist.dashboard.comparison import comparison_figures, named_runs
from nbdist.dashboard.pipeline import pipeline_figure, pipeline_summary
from nbdist.dashboard.report import write_report
from nbdist.run.handle import Run


def partition_frame(graph, chosen, layers: list[dict]) -> pd.DataFrame:
    """One row per stage: its layers, parameters and predicted time per micro-batch."""
    rows = []
    for s, (start, end) in enumerate(chosen.bounds):
        rows.append({"stage": s, "layers": ", ".join(graph.names[start:end]), "first": start,
                     "last": end - 1, "params": int(sum(r["params"] for r in layers[start:end])),
                     "predicted_s": chosen.stage_times[s], "measured_s": float("nan")})
    return pd.DataFrame(rows)


class PipelineRun(Run):
    """A `Run` of `--mode pipeline` (see `nbdist.modes.pipeline`)."""

    profile: pd.DataFrame  # per layer: forward_s, backward_s, params, cut_bytes (micro-batch size)
    source: str  # the cell, to train it again with other options (nbdist.train(run.source, ...))
    partitions: dict  # method -> nbdist.core.partition.Partition, all four for comparison

    @property
    def partition(self) -> pd.DataFrame:
        """Each stage's layers, parameters, predicted and measured time per micro-batch
        (measured: the stage's compute per step over the micro-batches, as the run goes)."""
        frame = self._partition.copy()
        info = self._pipeline_info()
        steps = info.get("measured_steps", 0)
        if steps:
            m = self.config.micro_batches
            frame["measured_s"] = [b / steps / m for b in info["busy"]]
        return frame

    @partition.setter
    def partition(self, frame: pd.DataFrame) -> None:
        self._partition = frame

    def _pipeline_info(self) -> dict:
        control = self.state.control
        return control.pipeline() if control is not None and hasattr(control, "pipeline") else {}

    @property
    def pipeline(self) -> dict:
        """The measured bubble fraction, its ideal (S-1)/(M+S-1), each stage's utilisation, the
        micro-batch timings of the latest steps (for `pipeline_figure`), the messages each
        stage sent (`messages`), and what each stage refused (`dropped`, per stage, by reason:
        messages that failed the limits, the MAC, a replay or the checks, and connections refused
        or cut at its gate) and what the kernel refused (`kernel_dropped`)."""
        info = self._pipeline_info()
        return pipeline_summary(info, self.config.stages, self.config.micro_batches)

    def pipeline_figure(self) -> dict:
        """The timeline of the latest complete step: forward, backward, update and idle per
        stage."""
        info = self._pipeline_info()
        last = info["steps"][-1]["ops"] if info.get("steps") else {}
        return pipeline_figure(last, self.config.stages, self.config.micro_batches, self.pipeline)

    def report(self, path: str = "nbdist-report.html", top_k: int | None = None,
               compare: list | None = None):
        """The HTML report (see `Run.report`) with the pipeline timeline and bubble added."""
        extra = {"pipeline timeline": self.pipeline_figure()}
        if compare:
            extra.update(comparison_figures(named_runs((self, *compare), None)))
        return write_report(path, history=self.history, nodes=self.nodes, timeline=self.timeline,
                            delays=self.delays, events=self.events,
                            title=f"nbdist run {self.run_id}", summary=self.summary(), top_k=top_k,
                            extra=extra, hubs=None)
