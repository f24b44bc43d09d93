import csv,sys,gzip
f=sys.argv[1]; top=int(sys.argv[2]) if len(sys.argv)>2 else 40
rows=list(csv.reader(gzip.open(f,'rt')))
path=None; hdr=None; out=[]; tot_s=0; tot_i=0
for r in rows:
    if r and r[0]=="File Path": path=r[1].split('/')[-1]; continue
    if r and r[0]=="Function Name": continue
    if r and r[0]=="Line No": hdr=r; continue
    if not r or not r[0] or r[0]=='' : continue
    d=dict(zip(hdr,r))
    try: s=int(d["Warp Stall Sampling (All Samples)"]); ins=int(d["Instructions Executed"])
    except: continue
    st={k:int(v) for k,v in d.items() if k.startswith("stall_") and "Not Issued" not in k and v.isdigit() and int(v)>0}
    out.append((s,ins,path,r[0],r[1][:110],st)); tot_s+=s; tot_i+=ins
print("total samples",tot_s,"instructions",tot_i)
out.sort(key=lambda x:-x[0])
for s,ins,p,ln,src,st in out[:top]:
    tops=sorted(st.items(),key=lambda x:-x[1])[:3]
    print(f"{100*s/tot_s:5.1f}% {100*ins/tot_i:5.1f}%i {p}:{ln} {src.strip()[:90]} | "+" ".join(f"{k[6:]}={100*v/s:.0f}" for k,v in tops))
