# One image for every raftmq role; docker-compose.yml picks the role by command.
FROM python:3.11-slim
WORKDIR /opt/raftmq
COPY pyproject.toml README.md ./
COPY raftlog ./raftlog
COPY namesrv ./namesrv
COPY broker ./broker
COPY controller ./controller
COPY client ./client
COPY spark_source ./spark_source
COPY chaos ./chaos
COPY proto ./proto
COPY scripts ./scripts
RUN pip install --no-cache-dir . && PYTHON=python bash scripts/gen_proto.sh
