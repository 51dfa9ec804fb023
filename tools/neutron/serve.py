"""Runs a real neutron-server API for tests, without Keystone or agents.

Used by scripts/neutron.sh; not meant to be run by hand.

    serve.py initdb SQLALCHEMY_URL   create every table of the current schema
    serve.py serve HOST PORT         serve the Neutron API until killed

The schema is created from the models instead of with `neutron-db-manage
upgrade heads` because Neutron's alembic migrations ALTER constraints, which
SQLite cannot do. The API is Neutron's own WSGI application
(`neutron.wsgi.api`), the one uwsgi runs in a real deployment; here the
standard library's wsgiref serves it, one request at a time, which is what a
test server on SQLite needs anyway.
"""

import sys


def initdb(url):
    import sqlalchemy
    from neutron.db.migration.models import head

    engine = sqlalchemy.create_engine(url)
    head.get_metadata().create_all(engine)
    print("created %d tables" % len(head.get_metadata().tables), flush=True)


def serve(host, port):
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    # Neutron parses sys.argv when the application boots.
    sys.argv = sys.argv[:1]
    from neutron.wsgi import api

    class Handler(WSGIRequestHandler):
        def log_message(self, fmt, *args):
            sys.stderr.write("access: %s\n" % (fmt % args))

    class Server(WSGIServer):
        # socketserver's default backlog of 5 is too short for the tests
        # that start eight clients at once: while one slow request is
        # served, the kernel drops the sixth SYN, and the client's SYN
        # retries (1 s, 2 s, 4 s, 8 s) outlast its 10 s connect timeout.
        request_queue_size = 128

    server = make_server(
        host, port, api.application, server_class=Server, handler_class=Handler
    )
    print("neutron-server listening on http://%s:%d" % (host, port), flush=True)
    server.serve_forever()


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "initdb":
        initdb(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]))
    else:
        sys.stderr.write(__doc__)
        sys.exit(2)


if __name__ == "__main__":
    main()
