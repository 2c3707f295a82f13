"""A run assembled and started: ``execute``, its services' placement, the Prefect flow.

``run`` (``execute``: store, lease, executor and services, step by step), ``placement``
(where the generator, learner and scorer run), ``flow`` (the one Prefect flow a run runs
as) and ``deploy`` (deployments on work pools). The composition root: it may import every
package below it (``core``, ``runner``, ``report``, ``transport``).
"""
