"""The IoT application's scorer on the JVM: its Java sources (``java/``), compiled at
setup into ``kappaflow-iot.jar``, which the real-time scorer's driver puts on its
``spark.jars``."""
