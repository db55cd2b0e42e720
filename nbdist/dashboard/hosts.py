"""The hosts view: which worker is on which host, and each worker's traffic to the hub.

Responsible for `hosts_figure(nodes, hubs)`: one group of bars per host (the hosts of hub
shards named as such, and shown with a marker per shard even when no worker runs there), one
bar per worker in its colour, its height the worker's traffic in MB/s (sent and received,
counted on its sockets), its label the link it uses: "shm" (shared memory on the hub's host,
only headers cross ZeroMQ) or "tcp" (across hosts, the arrays too).

Pure (pandas, standard library; no plotly), like `figures`.
"""

from __future__ import annotations

import pandas as pd

from nbdist.dashboard.style import OTHERS_COLOR, empty_figure, layout, missing, worker_color

__all__ = ["HOSTS_TITLE", "hosts_figure"]

HOSTS_TITLE = "traffic per worker, by host"
MB = 1e6
MULTICATEGORY_PX = 24  # the second row of x labels (the host names) under the worker labels


def _records(rows: pd.DataFrame | list[dict] | None) -> list[dict]:
    if rows is None:
        return []
    return rows.to_dict("records") if isinstance(rows, pd.DataFrame) else list(rows)


def _number(v: object) -> float:
    return 0.0 if missing(v) else float(v)


def _host_labels(hosts: list[str], hubs: list[dict]) -> dict[str, str]:
    """host -> its group label, e.g. "node-a · hub 0,1" for a host that runs hub shards."""
    shards: dict[str, list[int]] = {}
    for h in hubs:
        shards.setdefault(h.get("host") or "?", []).append(int(h["shard"]))
    return {host: (f"{host} · hub {','.join(map(str, sorted(shards[host])))}" if host in shards
                   else host)
            for host in hosts}


def _wire_note(row: dict) -> str:
    """"<br>int8: frames 25% of float32's" for a worker whose frames are compressed."""
    codec, ratio = row.get("compression"), row.get("compression_ratio")
    if missing(codec) or codec == "none" or missing(ratio):
        return ""
    return f"<br>{codec}: frames {100 * float(ratio):.0f}% of float32's"


def hosts_figure(nodes: pd.DataFrame | list[dict] | None,
                 hubs: pd.DataFrame | list[dict] | None = None) -> dict:
    """Workers grouped by host, each bar the worker's traffic in MB/s over its link; hub
    shards' hosts are marked ("· hub 0") and each shard drawn as a grey diamond at zero.

    `nodes` are `run.nodes` (worker, host, link, bytes_per_s, bytes_sent, bytes_received);
    `hubs` are `run.hubs` (shard, host).

    Example:
        >>> fig = hosts_figure([{"worker": 0, "host": "a", "link": "tcp", "bytes_per_s": 2.5e6}],
        ...                    [{"shard": 0, "host": "b"}])
        >>> [(t["name"], t["x"], t["y"]) for t in fig["data"]]
        [('worker 0', [['a'], ['w0 tcp']], [2.5]), ('hub shard', [['b · hub 0'], ['hub 0']], [0])]
    """
    workers = [r for r in _records(nodes) if not missing(r.get("worker"))]
    hubs = _records(hubs)
    if not workers:
        return empty_figure(HOSTS_TITLE)
    hosts = sorted({r.get("host") or "?" for r in workers} | {h.get("host") or "?" for h in hubs})
    label = _host_labels(hosts, hubs)
    traces = []
    for host in hosts:
        for r in sorted((r for r in workers if (r.get("host") or "?") == host),
                        key=lambda r: int(r["worker"])):
            w, link = int(r["worker"]), r.get("link") or ""  # none: a sync rank (Gloo's traffic)
            rate = _number(r.get("bytes_per_s")) / MB
            hover = (f"worker {w} on {host} ({link or 'no nbdist link'})<br>{rate:.2f} MB/s<br>"
                     f"sent {_number(r.get('bytes_sent')) / MB:.1f} MB, "
                     f"received {_number(r.get('bytes_received')) / MB:.1f} MB"
                     + _wire_note(r))
            traces.append({"type": "bar", "x": [[label[host]], [f"w{w} {link}".strip()]],
                           "y": [rate], "name": f"worker {w}", "legendgroup": f"worker {w}",
                           "showlegend": False, "marker": {"color": worker_color(w)},
                           "hovertext": [hover], "hoverinfo": "text"})
    if hubs:
        ordered = sorted(hubs, key=lambda h: (hosts.index(h.get("host") or "?"), int(h["shard"])))
        traces.append({"type": "scatter", "mode": "markers", "name": "hub shard",
                       "x": [[label[h.get("host") or "?"] for h in ordered],
                             [f"hub {int(h['shard'])}" for h in ordered]],
                       "y": [0] * len(ordered), "cliponaxis": False,
                       "marker": {"symbol": "diamond", "size": 12, "color": OTHERS_COLOR},
                       "hovertext": [f"hub shard {int(h['shard'])} on {h.get('host') or '?'}"
                                     for h in ordered],
                       "hoverinfo": "text"})
    fig_layout = layout(HOSTS_TITLE, "", "MB/s (sent + received)", traces, barmode="group")
    fig_layout["margin"]["b"] += MULTICATEGORY_PX
    fig_layout["xaxis"]["type"] = "multicategory"
    return {"data": traces, "layout": fig_layout}
