"""The sink's per-batch checks and conversion (SinkRows) on Arrow batches as Spark hands them: a bad
row is named by its row number in the task before anything of its batch is sent, text bodies
are their UTF-8 bytes, and rows with nothing but a body reach the SDK as a BodyColumn."""

from __future__ import annotations

import pyarrow as pa
import pytest

from raftmq.client.messages import OutgoingMessage
from raftmq.common.stored_batch import BodyColumn
from raftmq.spark_source.options import SinkOptions, parse_sink_options
from raftmq.spark_source.sink import SinkRows, SinkSchemaError

WITH_TOPIC = parse_sink_options({"nameServer": "127.0.0.1:9876", "topic": "t"})
NO_TOPIC = parse_sink_options({"nameServer": "127.0.0.1:9876"})


def _batch(**columns: pa.Array) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(list(columns.values()), names=list(columns))


def test_bare_bodies_go_as_a_body_column_over_the_batchs_buffers() -> None:
    """Rows of nothing but a body reach the SDK as a BodyColumn reading the Arrow batch's own
    buffers (no bytes object per row), strided rows as a queue gets them included; rows picked
    by a list (a `topic` column) as a column of their own."""
    values = pa.array(["é", "ab", "xyz", "q"])
    rows = SinkRows.of(_batch(value=values), WITH_TOPIC, 0)
    assert rows.topics is None  # the option names the topic
    col, sizes = rows.pick(range(4))
    assert isinstance(col, BodyColumn)
    assert list(col) == [b"\xc3\xa9", b"ab", b"xyz", b"q"]  # text bodies are their UTF-8 bytes
    assert list(sizes) == [2, 2, 3, 1]
    assert isinstance(col.data, pa.Buffer)  # the batch's own buffer, not a copy
    assert col.data.address == values.buffers()[2].address
    col, sizes = rows.pick(range(1, 4, 2))
    assert (list(col), list(sizes)) == ([b"ab", b"q"], [2, 1])
    sliced = SinkRows.of(_batch(value=values.slice(1)), WITH_TOPIC, 0)  # an array's offset
    col, sizes = sliced.pick(range(0, 3, 2))
    assert (list(col), list(sizes)) == ([b"ab", b"q"], [2, 1])
    col, sizes = rows.pick([3, 0])
    assert (list(col), list(sizes)) == ([b"q", b"\xc3\xa9"], [1, 2])


def test_rows_with_keys_tags_or_properties_become_messages() -> None:
    batch = _batch(
        value=pa.array([b"a", b"b"]),
        key=pa.array([b"k1", None]),
        tags=pa.array(["TagA", ""]),
        properties=pa.array([[("p", "1")], None], pa.map_(pa.string(), pa.string())),
    )
    messages, sizes = SinkRows.of(batch, WITH_TOPIC, 0).pick(range(2))
    assert messages == [
        OutgoingMessage(b"a", tags="TagA", keys=("k1",), properties={"p": "1"}),
        OutgoingMessage(b"b"),  # an empty tag is no tag, as on the row path
    ]
    assert list(sizes) == [1, 1]


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
