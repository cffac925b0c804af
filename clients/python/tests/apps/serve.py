"""Start one test application: serve.py KIND PORT, KIND one of flask, fastapi,
flask-conformance, fastapi-conformance, django-wsgi-conformance (sync views) and
django-wsgi-async-conformance (``async def`` views) under werkzeug's threaded server,
django-asgi-conformance (``async def`` views) under uvicorn; settings from the environment."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main() -> None:
    kind, port = sys.argv[1], int(sys.argv[2])
    if kind.startswith("flask") or kind.startswith("django-wsgi"):
        import logging

        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
        if kind.startswith("django-wsgi"):
            from conformance_app import create_django
            asynchronous = kind == "django-wsgi-async-conformance"
            create_app = lambda: create_django(asynchronous, wsgi=True)  # noqa: E731
        elif kind == "flask-conformance":
            from conformance_app import create_flask as create_app
        else:
            from flask_app import create_app
        make_server("127.0.0.1", port, create_app(), threaded=True).serve_forever()
    else:
        import uvicorn

        if kind == "django-asgi-conformance":
            from conformance_app import create_django
            create_fastapi = lambda: create_django(asynchronous=True, wsgi=False)  # noqa: E731
        elif kind == "fastapi-conformance":
            from conformance_app import create_fastapi
        else:
            from fastapi_app import create_app as create_fastapi
        # Django's ASGI handler serves HTTP only, no lifespan events
        uvicorn.run(create_fastapi(), host="127.0.0.1", port=port, log_level="warning",
                    access_log=False, lifespan="off" if kind.startswith("django") else "auto")


if __name__ == "__main__":
    main()
