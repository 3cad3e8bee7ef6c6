import os, sys, time, urllib.request
from toxiproxy.api import APIConsumer
APIConsumer.host, APIConsumer.port = "127.0.0.1", int(os.environ["API_PORT"])
UP = os.environ["UPSTREAM"]
from toxiproxy import Toxiproxy
t = Toxiproxy()
print("running:", t.running(), "version:", t.version())
p = t.create(upstream=UP, name="web")
print("proxy:", p.name, p.listen, p.upstream, p.enabled)
url = "http://%s/" % p.listen
def get():
    s = time.time(); body = urllib.request.urlopen(url, timeout=5).read(); return body, round((time.time()-s)*1000, 1)
print("direct through proxy:", get())
p.add_toxic(type="latency", attributes={"latency": 150, "jitter": 0})
print("toxics:", {k: (v.type, v.stream, v.attributes, v.toxicity) for k, v in p.toxics().items()})
print("with latency:", get())
p.destroy_toxic("latency_downstream")
print("after removal:", get())
p.disable()
try:
    get(); print("disable: still answered!")
except Exception as e:
    print("disabled:", type(e).__name__, e)
p.enable()
print("enabled again:", get())
p.add_toxic(type="bandwidth", stream="upstream", attributes={"rate": 0}, name="cut")
print("proxies:", list(t.proxies().keys()), "get_proxy:", t.get_proxy("web").name)
try:
    t.create(upstream=UP, name="web")
except Exception as e:
    print("create twice:", type(e).__name__, e)
try:
    p.add_toxic(type="nope")
except Exception as e:
    print("bad toxic:", type(e).__name__, e)
print("reset:", t.reset(), [ (k, len(v.toxics())) for k, v in t.proxies().items()])
t.destroy_all(); print("after destroy_all:", t.proxies())
