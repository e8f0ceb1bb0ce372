"""A real single-node Apache Kafka 4.x broker (KRaft, combined broker+controller) on loopback.

Used by the test suite and the benchmarks; the jars come from Maven Central via scripts/setup.sh.

    with KafkaBroker() as broker:
        print(broker.bootstrap)   # "127.0.0.1:PORT"

``stop()`` shuts it down cleanly, ``kill()`` sends SIGKILL (fault injection), ``pause()``/``resume()``
freeze it with SIGSTOP/SIGCONT to simulate a slow or hung broker, and ``start()`` again reuses the same
log directory and port, so a restarted broker keeps its topics and committed offsets.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

from .paths import kafka_libs
from .process import Service, free_port, log_tail, spawn, stop_process_group


class KafkaBroker(Service):
    def __init__(self, workdir: Path | None = None, port: int | None = None, partitions: int = 1,
                 auto_create_topics: bool = True):
        super().__init__(workdir, "kafka-")
        self.port = port or free_port()
        self.controller_port = free_port()
        self.partitions = partitions
        # False: a topic exists only once create_topic() made it, like most production clusters;
        # producers see UNKNOWN_TOPIC_OR_PARTITION until then
        self.auto_create_topics = auto_create_topics
        self.proc: subprocess.Popen | None = None
        self._formatted = False

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _write_config(self) -> Path:
        logs = self.workdir / "data"
        props = self.workdir / "server.properties"
        props.write_text("\n".join([
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.bootstrap.servers=127.0.0.1:{self.controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names=CONTROLLER",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "inter.broker.listener.name=PLAINTEXT",
            f"log.dirs={logs}",
            f"num.partitions={self.partitions}",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=4",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            f"auto.create.topics.enable={'true' if self.auto_create_topics else 'false'}",
            "log.flush.interval.messages=1",
            "",
        ]))
        log4j = self.workdir / "log4j2.yaml"
        log4j.write_text(
            "Configuration:\n  Appenders:\n    Console:\n      name: STDOUT\n      target: SYSTEM_OUT\n"
            "      PatternLayout:\n        pattern: \"[%d] %p %m (%c)%n\"\n"
            "  Loggers:\n    Root:\n      level: WARN\n      AppenderRef:\n        - ref: STDOUT\n"
        )
        return props

    def _java(self, main: str, *args: str, **kw) -> list[str]:
        heap = os.environ.get("KAFKA_TEST_HEAP", "-Xmx512m")
        return ["java", heap, "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.yaml'}",
                "-cp", f"{kafka_libs()}/*", main, *args]

    def start(self, timeout: float = 90.0) -> KafkaBroker:
        props = self._write_config()
        if not self._formatted and not (self.workdir / "data" / "meta.properties").exists():
            cluster_id = uuid.uuid4().hex[:22]
            subprocess.run(
                self._java("kafka.tools.StorageTool", "format", "--cluster-id", cluster_id,
                           "--config", str(props), "--standalone", "--ignore-formatted"),
                check=True, capture_output=True, timeout=120,
            )
            self._formatted = True
        self.proc = spawn(self._java("kafka.Kafka", str(props)), self.workdir / "broker.log")
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Block until the broker accepts a produce (not merely a TCP connect)."""
        from kafka import KafkaProducer

        deadline = time.time() + timeout
        last: Exception | None = None
        while time.time() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"Kafka exited with {self.proc.returncode}; see {self.workdir / 'broker.log'}:\n"
                                   + self.log_tail())
            try:
                if not self.auto_create_topics:
                    self.create_topic("__readiness_probe")
                producer = KafkaProducer(bootstrap_servers=self.bootstrap, request_timeout_ms=5000,
                                         max_block_ms=5000)
                try:
                    producer.send("__readiness_probe", b"ok").get(timeout=10)
                    return
                finally:
                    producer.close(timeout=2)
            except Exception as e:  # noqa: BLE001 (any failure means "not ready yet")
                last = e
                time.sleep(0.5)
        raise TimeoutError(f"Kafka at {self.bootstrap} not ready after {timeout:.0f} s: {last!r}\n" + self.log_tail())

    def log_tail(self, n: int = 40) -> str:
        return log_tail(self.workdir / "broker.log", n)

    def create_topic(self, name: str, partitions: int = 1) -> None:
        from kafka.admin import KafkaAdminClient, NewTopic
        from kafka.errors import TopicAlreadyExistsError

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap)
        try:
            admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
        except TopicAlreadyExistsError:
            pass
        finally:
            admin.close()

    def _signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def kill(self) -> None:
        self.resume()
        self._signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=30)
        self.proc = None

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is not None:
            stop_process_group(self.proc, timeout)
        self.proc = None
