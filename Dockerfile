# One image for every raftmq role; docker-compose.yml picks the role by command.
# The package installs from the source tree as it is (the wire modules are committed); the
# server extra brings the Raft, lmdb and uvloop dependencies, the cli extra the `raftmq` command.
FROM python:3.11-slim
WORKDIR /opt/raftmq
COPY pyproject.toml README.md pyspark_raftmq.py ./
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
RUN pip install --no-cache-dir '.[server,cli]'
