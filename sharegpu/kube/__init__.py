"""The Kubernetes runtime both daemons share: the REST client (:mod:`.rest`), list-watch
(:mod:`.informer`), Lease leader election (:mod:`.leader`), the API server's ResourceSlice rules
(:mod:`.slicerules`), logging (:mod:`.logs`) and OpenTelemetry set-up (:mod:`.telemetry`).

Imports only :mod:`api` from this project."""
