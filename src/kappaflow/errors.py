"""The exception tree: one root, a class per subsystem, a class per failure condition.

Every failure kappaflow raises on purpose has its own stable code, listed once here and
in docs/errors.md (a test keeps the two equal). A condition's code stays in its
subsystem's hundred (KF6xx for jobs), and its class derives from the subsystem's class, so
``except JobError`` still catches it. Every class mixes in the builtin it resembles, so
``except ValueError`` or ``except TimeoutError`` still works for callers who do not know
kappaflow. The CLI prints ``error[CODE]: message`` and exits with the class's
``exit_code``; anything else is a bug and keeps its traceback.

The subsystem classes keep their own codes (KF100, KF200, …) for errors that name no
condition: those raised by pipelines and tools outside this package.
"""

from __future__ import annotations


class KappaflowError(Exception):
    """Root of every error kappaflow raises on purpose."""

    code = "KF000"
    #: Exit status the CLI uses for this error.
    exit_code = 1


# KF0xx: the command line and waiting, common to every subsystem.


class CommandLineError(KappaflowError, ValueError):
    """The command line is wrong: unknown command or option, missing or bad argument.

    click raises its own exceptions; the CLI shows them under this code.
    """

    code = "KF001"
    exit_code = 2


class WaitTimeoutError(KappaflowError, TimeoutError):
    """A condition kappaflow waited for did not come true within its deadline."""

    code = "KF002"


class OperatingSystemError(KappaflowError, OSError):
    """The operating system refused an operation: a permission, a path that is a file, a
    full disk. The CLI shows any ``OSError`` it did not expect under this code."""

    code = "KF003"


# KF1xx: configuration.


class ConfigError(KappaflowError, ValueError):
    """A setting, a flag value or the configuration file is invalid."""

    code = "KF100"
    exit_code = 2


class InvalidSettingError(ConfigError):
    """A setting (file, environment or flag) fails validation."""

    code = "KF101"


class ConfigSyntaxError(ConfigError):
    """The configuration file is not valid TOML."""

    code = "KF102"


class ConfigFileNotFoundError(ConfigError, FileNotFoundError):
    """The configuration file given with --config does not exist."""

    code = "KF103"


# KF2xx: prerequisites installed by `make setup`.


class SetupError(KappaflowError, RuntimeError):
    """A prerequisite is missing: Java, Maven, resolved jars, a Redis binary."""

    code = "KF200"


class JavaNotFoundError(SetupError):
    """No usable Java: none found, or it cannot be run or report its version."""

    code = "KF201"


class JavaTooOldError(SetupError):
    """The Java found is older than the broker and Spark need."""

    code = "KF202"


class JarsNotResolvedError(SetupError, LookupError):
    """The jars a service needs have not been resolved by setup."""

    code = "KF203"


class MavenError(SetupError):
    """Fetching Maven or resolving jars from Maven Central failed."""

    code = "KF204"


class JarBuildError(SetupError):
    """A jar kappaflow compiles at setup cannot be built (javac failed, a PySpark jar it
    compiles against is missing)."""

    code = "KF205"


class RedisNotFoundError(SetupError, LookupError):
    """No redis-server binary: the configured one does not exist, or none is installed."""

    code = "KF206"


class JarsDirError(SetupError, PermissionError):
    """The jars directory cannot be created."""

    code = "KF207"


class MqttBrokerNotFoundError(SetupError, LookupError):
    """No MQTT broker to run: the configured mosquitto does not exist, or neither
    mosquitto nor the amqtt package is installed."""

    code = "KF208"


class PostgresNotFoundError(SetupError, LookupError):
    """No PostgreSQL server to run: the configured ``postgres.bin_dir`` lacks it, or none
    is installed."""

    code = "KF210"


class ClassArchiveError(SetupError):
    """The driver that writes Spark's class-data archive at setup failed or ran too long."""

    code = "KF209"


# KF3xx: the embedded services (Kafka broker, Redis).


class ServiceError(KappaflowError, RuntimeError):
    """An embedded service (broker, Redis) cannot be started, reached or stopped."""

    code = "KF300"


class PortInUseError(ServiceError):
    """A port the service needs is already in use."""

    code = "KF301"


class StateDirError(ServiceError, PermissionError):
    """The service's state directory is not writable."""

    code = "KF302"


class ServiceExitedError(ServiceError):
    """The service exited during start-up (or its storage could not be formatted)."""

    code = "KF303"


class ServiceStartTimeoutError(ServiceError, TimeoutError):
    """The service did not answer within its start-up deadline; it was stopped."""

    code = "KF304"


class ExternalServiceError(ServiceError):
    """The service is external (configured by address): kappaflow does not manage it."""

    code = "KF305"


class RedisUnreachableError(ServiceError, ConnectionError):
    """Redis, the serving store, does not answer."""

    code = "KF306"


class PostgresUnreachableError(ServiceError, ConnectionError):
    """PostgreSQL, the database of a ``kf.postgres()`` sink, does not answer or refuses
    kappaflow's connection."""

    code = "KF311"


class ProcessStopError(ServiceError):
    """A managed process survived SIGKILL."""

    code = "KF307"


class MqttConnectError(ServiceError, ConnectionError):
    """The MQTT broker cannot be reached, or refuses the bridge's connection or
    subscription."""

    code = "KF308"


class BrokerCountError(ServiceError, ValueError):
    """The embedded Kafka was asked to start with another number of nodes than its
    storage was made with."""

    code = "KF310"


# KF4xx: the Kafka cluster.


# Not ``KafkaError``: that is confluent-kafka's error value, which code using both would
# have to import under another name.
class KafkaClusterError(KappaflowError, RuntimeError):
    """The Kafka cluster refused or failed a request."""

    code = "KF400"


class KafkaUnreachableError(KafkaClusterError, ConnectionError):
    """The Kafka cluster cannot be reached at its bootstrap servers."""

    code = "KF401"


class TopicExistsError(KafkaClusterError):
    """The topic to create already exists."""

    code = "KF402"


class KafkaRequestError(KafkaClusterError):
    """The cluster refused an admin request: create or delete a topic, read its configs."""

    code = "KF403"


class TopicNotFoundError(KafkaClusterError, LookupError):
    """A topic that the command needs does not exist."""

    code = "KF404"


class ProduceError(KafkaClusterError):
    """Writing records to a topic failed (send, replay, a counting batch's transaction)."""

    code = "KF405"


class ConsumeError(KafkaClusterError):
    """Reading a topic failed, or its offsets could not be looked up by time."""

    code = "KF406"


class MirrorStartError(KafkaClusterError):
    """MirrorMaker exited during start-up, or did not replicate within its deadline; it
    was stopped and its configuration removed."""

    code = "KF420"


class MirrorClusterUnreachableError(KafkaClusterError, ConnectionError):
    """A cluster the mirror joins, the primary or the backup, does not answer."""

    code = "KF421"


class MirrorTargetError(KafkaClusterError, ValueError):
    """The mirror has no backup cluster to go to, or was given the primary itself."""

    code = "KF422"


class CheckpointRewindError(KafkaClusterError):
    """A job's checkpoint cannot be moved to this cluster's offsets: the job runs, its
    checkpoint is not on this machine, or it has no committed batch to go on from."""

    code = "KF423"


class ConnectStartError(KafkaClusterError):
    """The Kafka Connect worker exited during start-up, or its REST API did not answer
    within its deadline; it was stopped."""

    code = "KF424"


class ConnectRequestError(KafkaClusterError):
    """The Kafka Connect worker does not run, or refused a request to its REST API (a
    connector's configuration, a name taken or unknown), or a connector failed."""

    code = "KF425"


class RegistryStartError(KafkaClusterError):
    """The schema registry exited during start-up or did not answer within its deadline,
    or Kafka, where it keeps its schemas, does not answer; it was stopped."""

    code = "KF430"


class RegistryRequestError(KafkaClusterError):
    """The schema registry does not answer, or refused a request (an unknown subject or
    version, a schema that does not parse, an incompatible schema)."""

    code = "KF431"


# KF5xx: input given to a command (values, times, options of a counting job).


class InputError(KappaflowError, ValueError):
    """Input data (JSON lines, times, offsets) cannot be used as given."""

    code = "KF500"


class InvalidDurationError(InputError):
    """A duration is not a number and a unit (10s, 5m, 1h)."""

    code = "KF501"


class InvalidTimeError(InputError):
    """A point in time cannot be parsed or has no time zone."""

    code = "KF502"


class InvalidPairError(InputError):
    """A KEY=VALUE pair (job parameter, topic config) has no '=' or no key."""

    code = "KF503"


class OutOfRangeError(InputError):
    """A count is out of range: negative --max or --offset, partitions or replicas below 1."""

    code = "KF504"


class PartitionNotFoundError(InputError, LookupError):
    """The topic has no partition of that number."""

    code = "KF505"


class SameTopicError(InputError):
    """Replay was given the same topic as source and destination."""

    code = "KF506"


class InvalidFieldError(InputError):
    """A counting job's --key, --time or --id is not a field name."""

    code = "KF507"


class ConflictingOptionsError(InputError):
    """Options of a counting job exclude or need each other (--window, --session-gap,
    --slide, --realtime, --available-now)."""

    code = "KF508"


class InvalidWindowError(InputError):
    """A counting job's window, slide, session gap, watermark or lateness is out of range."""

    code = "KF509"


class InvalidTopicFilterError(InputError):
    """The MQTT bridge's topic filter has no single-level wildcard (``+``) for the
    device id."""

    code = "KF510"


# KF6xx: streaming jobs.


class JobError(KappaflowError, RuntimeError):
    """A streaming job cannot be started, found or stopped."""

    code = "KF600"


class JobNotFoundError(JobError, LookupError):
    """No job of that name was ever started (or it was removed)."""

    code = "KF601"


class InvalidJobNameError(JobError, ValueError):
    """A job name has characters other than letters, digits, '.', '_' and '-'."""

    code = "KF602"


class PipelineNotFoundError(JobError, LookupError):
    """No pipeline of that name, module or attribute."""

    code = "KF603"


class InvalidPipelineError(JobError, TypeError):
    """The pipeline reference is malformed or names something that is not a Pipeline."""

    code = "KF604"


class JobRunningError(JobError):
    """The job is running and the command needs it stopped (start, remove)."""

    code = "KF605"


class JobNotRunningError(JobError):
    """The job to stop is not running."""

    code = "KF606"


class JobStartError(JobError):
    """The job (or one of its parts) failed or exited while starting."""

    code = "KF607"


class JobStartTimeoutError(JobError, TimeoutError):
    """The job did not start within its deadline; it was stopped."""

    code = "KF608"


class MissingParameterError(JobError, LookupError):
    """The pipeline needs a parameter (-P KEY=VALUE) the job was not given."""

    code = "KF609"


class InvalidParameterError(JobError, ValueError):
    """A job parameter (-P KEY=VALUE) has a value the job cannot use."""

    code = "KF616"


class JobDirError(JobError, PermissionError):
    """The job's directory cannot be created."""

    code = "KF610"


class NotACountJobError(JobError):
    """A `count` command was given a job that is not a counting job."""

    code = "KF611"


class NoCommittedStateError(JobError, LookupError):
    """The job (or its output) has no committed state to read yet."""

    code = "KF612"


class UnknownPartError(JobError, LookupError):
    """A job part's driver was started for a part its pipeline does not have."""

    code = "KF613"


class PartialBatchError(JobError):
    """The counting sink found fewer too-late events than counted; it does not publish."""

    code = "KF614"


class CheckpointError(JobError, OSError):
    """A job's checkpoint could not be read where the job needs it (its offset log)."""

    code = "KF615"


class SavepointNotFoundError(JobError, LookupError):
    """The job has no savepoint of that label (or the path holds none)."""

    code = "KF620"


class SavepointJobMismatchError(JobError, ValueError):
    """The savepoint was taken of another job than the one to start from it."""

    code = "KF621"


class SavepointIncompatibleError(JobError, ValueError):
    """The job's code changed in a way its savepoint's state cannot take."""

    code = "KF622"


class SavepointExistsError(JobError, FileExistsError):
    """The job already has a savepoint of that label."""

    code = "KF623"


class InvalidSavepointLabelError(JobError, ValueError):
    """A savepoint label has characters other than letters, digits, '.', '_' and '-'."""

    code = "KF624"


class SavepointUnsupportedError(JobError):
    """The job cannot have a savepoint taken: not on the job API, no checkpoint yet, or a
    checkpoint or lake table on another machine's file system."""

    code = "KF625"


class SavepointDamagedError(JobError, OSError):
    """A savepoint's manifest or files are missing or unreadable."""

    code = "KF626"


class RestoreIncompleteError(JobError):
    """A start from a savepoint did not finish restoring the job: it starts from that
    savepoint only."""

    code = "KF627"


class SavepointTimeoutError(JobError, TimeoutError):
    """A running job's driver did not take the savepoint asked of it in time, or ended."""

    code = "KF628"


class JobStateError(JobError, LookupError):
    """A job's state cannot be read: the job has no such output, or a window output's
    checkpoint was started before kappaflow recorded its aggregates."""

    code = "KF629"


# KF7xx: jobs written on the job API (kappaflow.streams): their schemas, windows, sinks.


class StreamError(KappaflowError, ValueError):
    """A job written on the job API is wrong: its declaration, schema, windows or sinks."""

    code = "KF700"
    exit_code = 2


class UnsupportedFieldTypeError(StreamError, TypeError):
    """A record type's field has an annotation the job API cannot parse records into."""

    code = "KF701"


class NotARecordModelError(StreamError, TypeError):
    """A source's record type is not a dataclass or pydantic model class."""

    code = "KF702"


class EventTimeFieldError(StreamError):
    """A record type has more than one EventTime field, or one below the top level."""

    code = "KF703"


class UnresolvedFieldTypeError(StreamError, NameError):
    """A record type's field annotation is a name (a forward reference) that does not resolve."""

    code = "KF704"


class NoSuchFieldError(StreamError, LookupError):
    """A field path (a key, id or time argument) names no field of the record type."""

    code = "KF705"


class TimeFieldTypeError(StreamError, TypeError):
    """The time field a source is parsed by is not a datetime or EventTime field."""

    code = "KF706"


class LakeSchemaError(StreamError):
    """A batch written to a Parquet lake table does not have the table's schema: a column
    is missing, added or of another type."""

    code = "KF721"


class LakeColumnError(StreamError):
    """A lake table's partition or date column is missing from the batch, of the wrong type,
    or clashes with the ``date`` column the writer adds."""

    code = "KF722"


class LakePartitioningError(StreamError):
    """A lake writer partitions by other columns than the table's committed batches."""

    code = "KF723"


class LakeManifestError(StreamError):
    """A lake table's manifest cannot be read: it is not the JSON kappaflow writes."""

    code = "KF724"


class LakePublishError(StreamError, OSError):
    """The file system refused a step of publishing a lake batch (a rename returned false)."""

    code = "KF725"


class StoragePathError(StreamError, OSError):
    """A checkpoint or lake path whose file system Spark cannot reach: no Hadoop file
    system for its scheme, or a URI it cannot parse."""

    code = "KF726"


class LakeCommitError(StreamError):
    """Delta Kernel failed to read or commit a lake table's Delta log (a damaged log, a
    refused transaction)."""

    code = "KF760"


class LakeVersionError(StreamError, LookupError):
    """A lake table has no such version to read (time travel), or a Delta command was given
    a table that is not a Delta table."""

    code = "KF761"


class UnknownAggregateError(StreamError, LookupError):
    """An aggregate of a kind kappaflow does not have."""

    code = "KF711"


class AggregateColumnError(StreamError):
    """An aggregate's column is not a non-empty name, or the events lack it."""

    code = "KF712"


class NonNumericColumnError(StreamError, TypeError):
    """A numeric aggregate (sum, min, max, mean, approx_quantiles) over a column that is
    not numeric."""

    code = "KF713"


class QuantilesError(StreamError):
    """approx_quantiles was given no quantiles, one outside (0, 1), or one twice."""

    code = "KF714"


class WindowSpecError(StreamError):
    """A window's size, slide, watermark or lateness is out of range."""

    code = "KF715"


class AggregatesSpecError(StreamError):
    """The windowed aggregates' declaration is wrong: no aggregates, a bad name, a value
    that is not an aggregate, or a key or id column the events lack."""

    code = "KF716"


class InvalidSinkError(StreamError):
    """A sink is declared wrong: a bad topic or table name, or a sink that cannot take
    what it is given (the serving store takes windowed results and keyed streams)."""

    code = "KF730"


class InvalidJobError(StreamError):
    """The job's declaration is wrong: no output, two outputs with one name, a bad name,
    a source without event time, something that is not an aggregate."""

    code = "KF731"


class UnknownColumnError(StreamError, LookupError):
    """A column the job names (a key, an aggregate's input) is not in its stream."""

    code = "KF732"


class RealTimeModeError(StreamError):
    """A job started in real-time mode has an operator or sink that mode cannot run: a
    Python one (a ``@kf.stateful`` function, a UDF), a session window, a join, a lake
    table."""

    code = "KF736"


class BuildFailedError(StreamError):
    """The job's ``build`` function raised an exception of its own."""

    code = "KF733"
    exit_code = 1


class StateIncompatibleError(StreamError):
    """A job's output changed what its state holds (window, keys, aggregates, source)
    while its checkpoint holds the old state."""

    code = "KF735"
    exit_code = 1


class HarnessError(StreamError, RuntimeError):
    """A job under the test harness failed, did not finish, or reads a source the test
    gave no batches."""

    code = "KF734"
    exit_code = 1


class NotStatefulFunctionError(StreamError, TypeError):
    """``Stream.process`` was given a function not decorated with ``@kf.stateful``."""

    code = "KF741"


class StateTypeError(StreamError, TypeError):
    """A stateful function's state type is not a dataclass that constructs with no
    arguments."""

    code = "KF742"


class StatefulOutputTypeError(StreamError, TypeError):
    """A stateful function's output type is not a record type kappaflow can write (it does
    not compile to a schema)."""

    code = "KF743"


class LateModeError(StreamError):
    """A stateful function's ``late=`` is not "function" or "topic"."""

    code = "KF744"


class ProcessColumnError(StreamError, LookupError):
    """``Stream.process`` names no key, a ``by`` column the stream lacks, or a record type
    whose fields the stream lacks."""

    code = "KF745"


class StateTtlError(StreamError):
    """A stateful function's ``ttl`` is not a positive duration."""

    code = "KF746"


class StatefulOutputError(StreamError, TypeError):
    """A stateful function yielded something other than its output type, or a value that
    cannot be written (a datetime without a zone)."""

    code = "KF747"


class StateRestoreError(StreamError, TypeError):
    """A key's stored state does not fit the state type any more (a field without a
    default was added, or a value changed type), or a value cannot be stored as JSON."""

    code = "KF748"


class TimerLoopError(StreamError, RuntimeError):
    """A stateful function keeps setting timers at or behind the watermark, which fire at
    once, without end."""

    code = "KF749"


class JoinSpecError(StreamError):
    """A join is declared wrong: an unknown ``how``, ``within`` missing for a stream or
    given for a table, a reference table without a key, a stream joined with itself."""

    code = "KF751"


class JoinColumnError(StreamError, LookupError):
    """A join's ``on`` column is missing on one side."""

    code = "KF752"


class JoinColumnClashError(StreamError):
    """The joined table or stream has a column the stream already has."""

    code = "KF753"


class StateAfterStreamJoinError(StreamError):
    """A stream join follows a stream-stream join: Spark refuses to redefine the
    watermark after a stateful operator."""

    code = "KF754"


class SchemaIncompatibleError(StreamError, TypeError):
    """A job's record type cannot read a registry subject's schema, or the schema it
    would register is a breaking change for the subject; the message names the field."""

    code = "KF755"


class SchemaFormatError(StreamError, ValueError):
    """A source's format cannot be used: its subject is unknown to the registry, its
    schema is not of the format's type (Avro, Protobuf) or does not compile, or a type in
    it has no Spark counterpart."""

    code = "KF756"


# KF770-KF779: a job's dead letters, listed and replayed (jobs/dead_letters.py).


class NoDeadLettersError(StreamError, LookupError):
    """The job has no dead-letter topic: no job of that name has run on the cluster."""

    code = "KF770"
    exit_code = 1


class FixFunctionError(StreamError):
    """``--fix`` does not name an importable function as ``MODULE:FUNCTION``."""

    code = "KF771"


class FixFailedError(StreamError, RuntimeError):
    """A replay's fix function raised, or returned something other than bytes or None;
    the dead letters of the transaction it was in are not replayed."""

    code = "KF772"
    exit_code = 1


# KF790-KF799: shadow runs of a job's new version (jobs shadow, diff, promote); each
# derives from the builtin it resembles only, as the KF7xx of jobs have no class of their own.


class ShadowExistsError(KappaflowError, FileExistsError):
    """The job already has a shadow (``jobs shadow NAME --stop`` drops it)."""

    code = "KF790"


class ShadowUnsupportedError(KappaflowError, ValueError):
    """The job cannot be shadowed: not a job on the job API, in real-time mode, or
    writing a PostgreSQL table the shadow would share."""

    code = "KF791"


class NoShadowError(KappaflowError, LookupError):
    """The job has no shadow to diff, promote or drop."""

    code = "KF792"


class ShadowBehindError(KappaflowError, TimeoutError):
    """At a promote, the shadow did not reach the live job's position (source offsets and
    watermark) in time, or is stopped behind it: the live job was started again."""

    code = "KF793"


# KF8xx: the HTTP APIs. Each class has the HTTP status its answer carries.


class GatewayError(KappaflowError):
    """An HTTP request the gateway refuses; answered as JSON ``{"code", "error"}``."""

    code = "KF800"
    status = 500


class GatewayBadRequestError(GatewayError, ValueError):
    """The request's body is not JSON, is too large, or holds too many items."""

    code = "KF801"
    status = 400


class GatewayUnauthorizedError(GatewayError, PermissionError):
    """The request has no token, or not the device's token."""

    code = "KF802"
    status = 401


class UnknownDeviceError(GatewayError, LookupError):
    """The device of the request is not in the device registry."""

    code = "KF803"
    status = 404


class GatewayOverloadError(GatewayError):
    """Too many records wait for Kafka's acknowledgement: the request is refused whole."""

    code = "KF804"
    status = 429


class GatewayUnavailableError(GatewayError):
    """Kafka did not acknowledge the request's records in time, or is known down."""

    code = "KF805"
    status = 503


class ApiError(KappaflowError):
    """A request the kappaflow service refuses; answered as JSON ``{"code", "error"}``."""

    code = "KF850"
    status = 500


class ApiBadRequestError(ApiError, ValueError):
    """A query parameter of the wrong form: a key that is not a JSON array, a time that is
    not ISO 8601, a limit out of range."""

    code = "KF851"
    status = 400


class UnknownOutputError(ApiError, LookupError):
    """The job has no output of that name in the serving store."""

    code = "KF852"
    status = 404


class UnknownKeyError(ApiError, LookupError):
    """The output has no windows for that key."""

    code = "KF855"
    status = 404


class ApiPathNotFoundError(ApiError, LookupError):
    """No endpoint at that path (or not for that method)."""

    code = "KF853"
    status = 404


class ApiBindRefusedError(ApiError):
    """The service was asked to listen beyond loopback, and it has no tokens."""

    code = "KF854"
    status = 500


# KF86x: SQL over the lake (POST /v1/sql, `kappaflow sql`).


class SqlSyntaxError(ApiError, ValueError):
    """The SQL is not one valid query: it does not parse, names an unknown column or
    function, or holds no statement or more than one."""

    code = "KF861"
    status = 400


class SqlForbiddenError(ApiError, PermissionError):
    """The SQL is not a read query (a write, DDL, ``SET``, ``ATTACH``, ``INSTALL``, ``COPY``),
    or reads a file, the network or anything else outside the lake tables."""

    code = "KF862"
    status = 403


class UnknownLakeTableError(ApiError, LookupError):
    """The SQL names a table that is not a committed lake table."""

    code = "KF863"
    status = 404


class SqlTimeoutError(ApiError, TimeoutError):
    """The query ran past ``api.sql_timeout_s`` and was interrupted.

    504, not 408: 408 says the client was too slow to send its request, and clients may
    repeat a 408 on their own, which would only run the same query into the same limit."""

    code = "KF864"
    status = 504


class SqlQueryFailedError(ApiError, ValueError):
    """The query is valid but failed while running: a cast or a value out of range, too
    little memory."""

    code = "KF865"
    status = 422


class NoChangelogError(ApiError, LookupError):
    """Push was asked of an output that writes no Kafka topic, the changes' only source."""

    code = "KF870"
    status = 404


class BadResumePointError(ApiError, ValueError):
    """A Last-Event-ID that is not a position the output's changes have had."""

    code = "KF871"
    status = 400


class SubscriberTooSlowError(ApiError):
    """A subscriber fell too far behind the changes and was dropped (its stream's last
    event, or its WebSocket's close reason); it resumes with its last event id."""

    code = "KF872"
    status = 503


class PushUnavailableError(ApiError):
    """The output's changes could not be read from Kafka in time."""

    code = "KF873"
    status = 503


class UnauthorizedError(ApiError):
    """The service has API tokens and the request came without a valid one."""

    code = "KF890"
    status = 401


class ForbiddenError(ApiError):
    """The request's token lacks the scope the request needs (admin)."""

    code = "KF891"
    status = 403


class UnknownTokenError(ApiError, LookupError):
    """No API token of that name."""

    code = "KF892"
    status = 404


class DuplicateTokenError(ApiError):
    """An API token of that name exists already."""

    code = "KF893"
    status = 409


class TokenFileError(ApiError):
    """The service's tokens file exists and cannot be read: no token can be checked, so
    every request but the open ones is refused until it is mended."""

    code = "KF894"
    status = 500


class TopicFollowerTooSlowError(ApiError):
    """A client following a topic read slower than the topic grew and was dropped (its
    stream's last event)."""

    code = "KF880"
    status = 503


# KF9xx: security: credentials, certificates, users and access control lists.


class SecurityError(KappaflowError, PermissionError):
    """A security failure that names no condition of its own."""

    code = "KF900"


class AuthenticationFailedError(SecurityError):
    """The broker refused the credentials: an unknown user or a wrong password."""

    code = "KF901"


class NotAuthorizedError(SecurityError):
    """The broker refused an operation: no access control list allows it to this user."""

    code = "KF902"


class TlsHandshakeError(SecurityError):
    """The TLS handshake with the broker failed: its certificate is not signed by the
    trusted authority, is expired, or does not name the address connected to."""

    code = "KF903"


class SecurityMaterialError(SecurityError):
    """The state directory's secrets or certificates cannot be read, or no longer match
    what the broker keeps."""

    code = "KF904"


class UnknownKafkaUserError(SecurityError, LookupError):
    """No Kafka user of that name."""

    code = "KF905"


class InvalidAclError(SecurityError, ValueError):
    """An access rule that cannot be: an unknown operation or resource kind, or a user
    name, password or resource name Kafka would refuse."""

    code = "KF906"
    exit_code = 2


class SecurityUnavailableError(SecurityError):
    """Users and access control lists were asked of a broker whose security is off."""

    code = "KF907"


class SecurityModeError(SecurityError):
    """The embedded broker runs with security on and was asked to run with it off, or the
    other way round: a running broker keeps its mode."""

    code = "KF908"


# KF910-KF914: rescaling a job (jobs/rescale.py).


class RescaleError(KappaflowError, RuntimeError):
    """A job cannot be rescaled as it is; KF910 itself: it runs, and ``--restart`` (stop
    it, rescale it, start it again) was not given."""

    code = "KF910"


class InvalidPartitionsError(RescaleError, ValueError):
    """A rescale to fewer than one partition."""

    code = "KF911"
    exit_code = 2


class RescaleNoChangeError(RescaleError, ValueError):
    """A rescale to the partitions the job already has."""

    code = "KF912"


class RescaleUnsupportedError(RescaleError):
    """The job cannot be rescaled: it runs in real-time mode, is not on the job API,
    keeps no state, or Spark's state repartitioning refused its checkpoint."""

    code = "KF913"


class RescaleUnfinishedBatchError(RescaleError):
    """The job's checkpoint ends with a batch that did not finish: rescaling would skip
    it, and the sinks that wrote part of it would write its input again."""

    code = "KF914"


# KF915-KF929: state that evolves through a savepoint (jobs/evolution.py).


class StateResetError(KappaflowError, ValueError):
    """``--reset-state OUTPUT`` names an output the job does not have, or one whose
    state cannot start afresh alone (a lake table's)."""

    code = "KF915"


def http_status(exc: KappaflowError) -> int:
    """The HTTP status the service answers ``exc`` with: its own, else by its kind."""
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return status
    if isinstance(exc, LookupError):
        return 404
    if isinstance(exc, ValueError):
        return 400
    return 500


def catalogue() -> dict[str, type[KappaflowError]]:
    """Every error class of this module by its code, in code order."""
    found: dict[str, type[KappaflowError]] = {}
    pending: list[type[KappaflowError]] = [KappaflowError]
    while pending:
        cls = pending.pop()
        if cls.__module__ == __name__:
            if found.get(cls.code, cls) is not cls:
                raise RuntimeError(
                    f"{cls.__name__} and {found[cls.code].__name__} share {cls.code}"
                )
            found[cls.code] = cls
        pending.extend(cls.__subclasses__())
    return dict(sorted(found.items()))
