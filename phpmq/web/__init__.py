"""`phpmq web`: a console in the browser for a broker or a sharded cluster (docs/web.md).

A process of its own, like nsqadmin: it talks to the broker with the ordinary client protocol
(`phpmq.AsyncClient`) and serves pages with Starlette under uvicorn; the broker's loop never
serves HTTP. Its parts:

- `watch`: the one client, polling `stats` (of every shard) and keeping the rates and graphs;
- `app` the application and its routes, `console` what every route needs (settings,
  templates, notices), `pages` the pages (read) and `actions` the actions (write);
- `access`: sessions, logins, roles and CSRF; `users` the users file, `throttle` failed logins,
  `exposure` where the console may listen without a login or TLS;
- `content`, `tables`: what the pages show, pure (content made safe, sorted rows, graphs).

Its dependencies are the `web` extra (`pip install 'phpmq-zmq[web]'`).
"""
