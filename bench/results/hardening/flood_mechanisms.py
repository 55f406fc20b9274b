import grpc, os, sys, time, threading, struct, subprocess
def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7f; n >>= 7
        if n: out.append(b | 0x80)
        else: out.append(b); return bytes(out)
def field(num, wt, payload):
    if wt == 0: return varint(num << 3) + varint(payload)
    return varint(num << 3 | 2) + varint(len(payload)) + payload
def header(rows, cols, dtype=1, diag=None):
    d = diag if diag is not None else struct.pack('<f', 1.0) * cols
    return field(1,0,rows)+field(2,0,cols)+field(3,0,dtype)+field(4,0,1)+field(5,0,1)+field(6,2,d)
def multiply_req(rows, cols, matrix=None):
    m = matrix if matrix is not None else os.urandom(16) * (rows*cols*4//16)
    return field(1,2,header(rows,cols)) + field(2,2,m)
def vm(pid):
    d = {}
    for l in open(f'/proc/{pid}/status'):
        k, v = l.split(':',1)
        if k in ('VmHWM','VmRSS'): d[k] = int(v.split()[0])//1024
    return d
if __name__ == '__main__':
    addr, pid, conns, calls, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    req = multiply_req(n, n)
    chans = [grpc.insecure_channel(addr, options=[('grpc.use_local_subchannel_pool',1),('grpc.max_send_message_length',-1),('grpc.max_receive_message_length',-1),('grpc.enable_retries',0)]) for _ in range(conns)]
    fns = [c.unary_unary('/dgmm.v1.Dgmm/Multiply') for c in chans]
    codes = {}
    peak = [0]
    stop = False
    def mon():
        while not stop:
            try: peak[0] = max(peak[0], vm(pid)['VmRSS'])
            except Exception: pass
            time.sleep(0.05)
    t = threading.Thread(target=mon); t.start()
    t0 = time.time()
    futs = [fns[i % conns].future(req, timeout=60) for i in range(calls)]
    for f in futs:
        try: f.result(); c = 'OK'
        except grpc.RpcError as e: c = e.code().name
        codes[c] = codes.get(c,0)+1
    stop = True; t.join()
    print(f"conns={conns} calls={calls} n={n} bytes={len(req)} codes={codes} wall={time.time()-t0:.1f}s peakRSS={peak[0]}MiB {vm(pid)}")
