# One image for every raftmq role; docker-compose.yml picks the role by command.
# The package installs from the source tree as it is (the wire modules are committed); the
# server extra brings the Raft, lmdb and uvloop dependencies, the cli extra the `raftmq` command.
# gcc builds the stored batch codec's C extension (setup.py; the image has the Python headers),
# then leaves the image again: the built extension needs only libc.
FROM python:3.11-slim
WORKDIR /opt/raftmq
COPY pyproject.toml setup.py README.md pyspark_raftmq.py ./
COPY raftmq ./raftmq
COPY common ./common
COPY raftlog ./raftlog
COPY namesrv ./namesrv
COPY broker ./broker
COPY controller ./controller
COPY client ./client
COPY ops ./ops
COPY spark_source ./spark_source
COPY chaos ./chaos
COPY proxy ./proxy
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install --no-cache-dir '.[server,cli]' \
    && cd / && python -c 'from raftmq.common import stored_batch as s; assert s.IMPLEMENTATION == "c"' \
    && apt-get purge -y gcc libc6-dev && apt-get autoremove -y && rm -rf /var/lib/apt/lists/*
