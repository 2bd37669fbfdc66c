# SPDX-License-Identifier: Apache-2.0
"""OpenStack Swift on insitu targets.

Swift stores each erasure-coded object as fragment archives, one per device; when those
devices are XFS file systems on insitu namespaces, the fragments lie on the drives that
can compute on them. This package holds:

* :mod:`insitu.swift.cluster`: ``insitu swift up|down|status|once``, a single-node Swift
  cluster on loopback for tests, demos and first tries (proxy, account, container and
  object servers and memcached in a private mount namespace; see ``docs/swift.md``), with
  its command line in :mod:`insitu.swift.cli`;
* :mod:`insitu.swift.client`: a minimal HTTP client of the Swift API (tempauth v1.0,
  containers, objects), on the standard library alone;
* :mod:`insitu.swift.resolve`: an object's fragment archives through Swift's ring, its
  metadata and fragment headers, every byte read checked;
* :mod:`insitu.swift.offload`: ``insitu wc|grep|exec ... swift://A/C/O``, each data
  fragment scanned on its target and the pieces joined at every edge;
* :mod:`insitu.swift.scrub`: ``insitu scrub --swift-dir``, the object auditor offloaded.

Swift itself runs in the system Python (Debian's ``python3-swift``), not in this package's
interpreter: this package only writes its configuration and starts its programs.
"""
