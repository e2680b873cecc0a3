"""The sink's per-batch checks and conversion (SinkRows) on Arrow batches as Spark hands them: a bad
row is named by its row number in the task before anything of its batch is sent, text bodies
are their UTF-8 bytes, and rows with nothing but a body reach the SDK as bare bytes."""

from __future__ import annotations

import pyarrow as pa
import pytest

from raftmq.client.messages import OutgoingMessage
from raftmq.spark_source.options import SinkOptions, parse_sink_options
from raftmq.spark_source.sink import SinkRows, SinkSchemaError

WITH_TOPIC = parse_sink_options({"nameServer": "127.0.0.1:9876", "topic": "t"})
NO_TOPIC = parse_sink_options({"nameServer": "127.0.0.1:9876"})


def _batch(**columns: pa.Array) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(list(columns.values()), names=list(columns))


def test_bare_bodies_go_as_bytes_with_their_sizes() -> None:
    rows = SinkRows.of(_batch(value=pa.array(["é", "ab"])), WITH_TOPIC, 0)
    assert rows.messages() == [b"\xc3\xa9", b"ab"]  # text bodies are their UTF-8 bytes
    assert rows.sizes == [2, 2]
    assert rows.topics is None  # the option names the topic


def test_rows_with_keys_tags_or_properties_become_messages() -> None:
    batch = _batch(
        value=pa.array([b"a", b"b"]),
        key=pa.array([b"k1", None]),
        tags=pa.array(["TagA", ""]),
        properties=pa.array([[("p", "1")], None], pa.map_(pa.string(), pa.string())),
    )
    assert SinkRows.of(batch, WITH_TOPIC, 0).messages() == [
        OutgoingMessage(b"a", tags="TagA", keys=("k1",), properties={"p": "1"}),
        OutgoingMessage(b"b"),  # an empty tag is no tag, as on the row path
    ]


@pytest.mark.parametrize(
    ("columns", "opts", "error"),
    [
        ({"value": pa.array([b"a", None, b"c"])}, WITH_TOPIC, "row 101: `value` is null"),
        (
            {"value": pa.array([b"a", b"b"]), "topic": pa.array(["t", None])},
            NO_TOPIC,
            "row 101: `topic` is null and no topic option is set",
        ),
        (
            {"value": pa.array([b"a", b"b"]), "topic": pa.array(["", "t"])},
            NO_TOPIC,
            "row 100: `topic` is null",
        ),
        (
            {"value": pa.array([b"a", b"b"]), "key": pa.array([b"ok", b"\xff"])},
            WITH_TOPIC,
            "row 101: column `key` is not UTF-8",
        ),
    ],
)
def test_a_bad_row_is_named_by_its_row_in_the_task(
    columns: dict[str, pa.Array], opts: SinkOptions, error: str
) -> None:
    with pytest.raises(SinkSchemaError, match=error):
        SinkRows.of(_batch(**columns), opts, 100)
