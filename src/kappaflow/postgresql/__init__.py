"""PostgreSQL: the embedded server (``kappaflow postgres``) and the connections of the
``kf.postgres()`` sink's driver side."""
