"""The demos: the whole architecture started on one machine, with visible results
(``clicks``: counting a clickstream; ``iot``: the IoT application, ``make demo``)."""
