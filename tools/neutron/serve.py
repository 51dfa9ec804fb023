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
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    # Neutron parses sys.argv when the application boots.
    sys.argv = sys.argv[:1]
    from neutron.wsgi import api

    class Handler(WSGIRequestHandler):
        def log_message(self, fmt, *args):
            sys.stderr.write("access: %s\n" % (fmt % args))

    server = make_server(host, port, api.application, handler_class=Handler)
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
