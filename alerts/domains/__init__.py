"""One module per domain of rules; :mod:`alerts.source` assembles them in file order.

=============  ==========================================================  ====================================
module         rules                                                       promtool tests (tests/alerts/)
=============  ==========================================================  ====================================
``serving``    request/stage recordings, SLO burn rates, error rate,       serving.test.yml, canary.test.yml
               canary verdict, queue backlog
``streaming``  wasted generation                                           streaming.test.yml
``overload``   retry storm, timeout mismatch                               overload.test.yml
``gpu``        GPU memory, leak, allocator, duplicates, collector          gpu*.test.yml
``drift``      fleet drift recordings (drift.rules.yml), drift alerts      drift.test.yml
``skew``       training-serving skew                                       skew.test.yml
``sidecar``    scrape, drops, decode errors, overflow, checkpoints         sidecar.test.yml
``engines``    vLLM and Triton native metrics                              engines.test.yml
``saturation`` binding resource, engine preemptions, XID, throttling,      saturation.test.yml
               engine scrapes
``capacity``   live-knee headroom, goodput burn rates (recordings too)      capacity.test.yml
=============  ==========================================================  ====================================

Shared annotation pieces live in :mod:`alerts.domains.common`, the rule model in :mod:`alerts.model` and the
template language in :mod:`alerts.template`.
"""
