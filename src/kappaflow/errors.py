"""The exception tree: one root, a subclass per subsystem, each with a stable code.

Every class mixes in the builtin it resembles, so ``except ValueError`` still works for
callers who do not know kappaflow. The CLI prints ``error[CODE]: message`` and exits
non-zero for any of these; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class KappaflowError(Exception):
    """Root of every error kappaflow raises on purpose."""

    code = "KF000"
    #: Exit status the CLI uses for this error.
    exit_code = 1


class ConfigError(KappaflowError, ValueError):
    """A setting, a flag value or the configuration file is invalid."""

    code = "KF100"
    exit_code = 2


class SetupError(KappaflowError, RuntimeError):
    """A prerequisite is missing: Java, Maven, resolved jars, a Redis binary."""

    code = "KF200"


class ServiceError(KappaflowError, RuntimeError):
    """An embedded service (broker, Redis) cannot be started, reached or stopped."""

    code = "KF300"


class KafkaError(KappaflowError, RuntimeError):
    """The Kafka cluster refused or failed a request."""

    code = "KF400"


class TopicNotFoundError(KafkaError, LookupError):
    """A topic that the command needs does not exist."""

    code = "KF404"


class InputError(KappaflowError, ValueError):
    """Input data (JSON lines, times, offsets) cannot be used as given."""

    code = "KF500"


class JobError(KappaflowError, RuntimeError):
    """A streaming job cannot be started, found or stopped."""

    code = "KF600"
