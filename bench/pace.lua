-- wrk script for the half-rate workload: each connection waits 1 ms after
-- every response, so the offered rate is about connections x 1000 req/s and
-- latency is measured below saturation.
function delay()
  return 1
end
