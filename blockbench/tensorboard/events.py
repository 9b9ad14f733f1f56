"""A TensorBoard run's event files on disk: written whole, read back for the views they carry, and
rewritten to carry other views.

TensorBoard lists every folder holding a file whose name has ``tfevents`` as a run and reads a run's
files in name order; it keeps the *first* summary metadata it reads per (run, tag), so the HParams
experiment a run shows is its first one, while the Custom Scalars plugin reads a run's last layout
(tensorboard 2.21). A running TensorBoard stops reading a run for good if the file it is on is
deleted. Hence: :func:`write_event_file` gives a file its event-file name only once it is complete
(never half read); :func:`run_views` reads the views a TensorBoard shows of a run; and
:func:`refresh_run_views` rewrites a run whose first views are not the wanted ones into one new file
that starts with them, the only place where event files are deleted. The rebuild from records, the
publication of a matrix's log folders and the cell's live writer all write through here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.custom_scalar import metadata as layout_metadata
from tensorboard.plugins.hparams import metadata
from tensorboard.summary.writer.record_writer import RecordWriter

#: the tags of the views in a run (``blockbench.tensorboard.views``): the HParams experiment, the
#: Custom Scalars layout
VIEW_TAGS = (metadata.EXPERIMENT_TAG, layout_metadata.CONFIG_SUMMARY_TAG)


def write_event_file(path: Path, records: Sequence[bytes], *, wall_time: float | None = None) -> Path:
    """An event file at ``path`` holding ``records`` (serialized events) after the file-version event
    every writer starts with (at ``wall_time``; now if None), complete before it gets its name, so
    that TensorBoard, which reads files whose name has ``tfevents``, never reads half of it."""
    partial = path.parent / f".writing.{os.getpid()}"  # no "tfevents" in the name: TensorBoard ignores it
    with open(partial, "wb") as stream:
        writer = RecordWriter(stream)
        version = Event(wall_time=time.time() if wall_time is None else wall_time, file_version="brain.Event:2")
        writer.write(version.SerializeToString())
        for record in records:
            writer.write(record)
    os.replace(partial, path)
    return path


def event_files(run_dir: Path) -> list[Path]:
    """The run's event files, oldest first (the order TensorBoard reads them in)."""
    return sorted(path for path in run_dir.iterdir() if "tfevents" in path.name) if run_dir.is_dir() else []


def run_views(run_dir: Path) -> list[bytes | None]:
    """The experiment and the layout a TensorBoard shows of the run (serialized summary values), None
    where absent: the first experiment (metadata: the first read wins) and the last layout (the Custom
    Scalars plugin reads a run's newest)."""
    found: dict[str, list[bytes]] = {tag: [] for tag in VIEW_TAGS}
    for path in event_files(run_dir):
        for record in RawEventFileLoader(str(path)).Load():
            if not any(tag.encode() in record for tag in VIEW_TAGS):  # most records: no need to parse them
                continue
            for value in Event.FromString(record).summary.value:
                if value.tag in found:
                    found[value.tag].append(value.SerializeToString())
    experiments, layouts = (found[tag] for tag in VIEW_TAGS)
    return [experiments[0] if experiments else None, layouts[-1] if layouts else None]


def refresh_run_views(run_dir: Path, summaries: Sequence[Summary]) -> bool:
    """Make ``summaries`` (experiment, layout) the views of the run ``run_dir``: unless they are
    already its first ones, write its events into one new event file that starts with them and
    holds every other record in its order (a resumption's purge marker included), then delete the
    old files. Returns whether it rewrote the run."""
    files = event_files(run_dir)
    wanted = [value.SerializeToString() for summary in summaries for value in summary.value]
    if not files or run_views(run_dir) == wanted:
        return False
    records = []
    for path in files:
        for record in RawEventFileLoader(str(path)).Load():
            event = Event.FromString(record)
            if event.HasField("file_version"):
                continue
            if any(value.tag in VIEW_TAGS for value in event.summary.value):
                kept = [value for value in event.summary.value if value.tag not in VIEW_TAGS]
                if not kept:
                    continue
                del event.summary.value[:]
                event.summary.value.extend(kept)
                record = event.SerializeToString()
            records.append(record)
    wall_time = time.time()
    views = [Event(wall_time=wall_time, step=0, summary=summary).SerializeToString() for summary in summaries]
    # named to sort right after the last file and before the files of later writers (a resumption's,
    # named after its start time)
    write_event_file(run_dir / f"{files[-1].name}.views", [*views, *records])
    for path in files:
        path.unlink(missing_ok=True)
    return True
