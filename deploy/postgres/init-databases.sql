-- Run by the postgres image on its first start only (an empty data volume), as the
-- POSTGRES_USER role, which owns what it creates. Each service has its own database;
-- the list and the settings are those of scripts/infra-up (PG_DATABASES in
-- scripts/lib.sh), so a containerised and a native setup sort and compare text alike.
CREATE DATABASE orders ENCODING 'UTF8' LC_COLLATE 'C.UTF-8' LC_CTYPE 'C.UTF-8' TEMPLATE template0;
CREATE DATABASE payments ENCODING 'UTF8' LC_COLLATE 'C.UTF-8' LC_CTYPE 'C.UTF-8' TEMPLATE template0;
CREATE DATABASE notifications ENCODING 'UTF8' LC_COLLATE 'C.UTF-8' LC_CTYPE 'C.UTF-8' TEMPLATE template0;
CREATE DATABASE provider ENCODING 'UTF8' LC_COLLATE 'C.UTF-8' LC_CTYPE 'C.UTF-8' TEMPLATE template0;
