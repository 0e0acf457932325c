# ruff: noqa: E501  (the page is HTML, CSS and JS kept compact in one string, not Python)
"""The dashboard page: one self-contained HTML document (inline CSS and JS, no CDN, no fonts fetched).

It polls ``/api/steps`` every 2 s and draws with DOM calls only: every name from the run (roles,
lanes, stages, files) goes through ``textContent`` or an SVG text node, never through HTML markup,
so a hostile lane name cannot inject anything. The page itself has no data in it.
"""

from __future__ import annotations

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>rl-trace watch</title>
<style>
:root{--bg:#f7f7f4;--fg:#1d2330;--mut:#6b7280;--line:#d9dbe0;--card:#fff;--warn:#b42318;--ok:#067647}
*{box-sizing:border-box}body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;background:var(--bg);color:var(--fg)}
header{padding:14px 22px;background:#1d2330;color:#fff;display:flex;gap:18px;align-items:baseline;flex-wrap:wrap}
header h1{font-size:18px;margin:0}header .run{opacity:.75;font-family:ui-monospace,monospace;font-size:12px}
main{padding:16px 22px;display:grid;gap:16px}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:12px 14px}
.card h2{font-size:13px;text-transform:uppercase;letter-spacing:.04em;color:var(--mut);margin:0 0 8px}
.stats{display:flex;gap:26px;flex-wrap:wrap}.stat b{display:block;font-size:22px}.stat span{color:var(--mut);font-size:12px}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}th,td{text-align:left;padding:5px 8px;border-bottom:1px solid var(--line);vertical-align:top}
th{font-size:12px;color:var(--mut);font-weight:600}td.num{text-align:right}
.alert{color:var(--warn);font-weight:600}.ok{color:var(--ok)}.mut{color:var(--mut)}
.tag{display:inline-block;padding:0 6px;border-radius:9px;background:#fef3c7;font-size:11px}
a{color:#1d4ed8}svg text{font:11px system-ui,sans-serif;fill:#374151}
.legend span{display:inline-block;margin-right:12px;font-size:12px}.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
</style></head><body>
<header><h1>rl-trace watch</h1><span class="run" id="run"></span><span id="updated" class="run"></span></header>
<main>
<section class="card"><div class="stats" id="stats"></div><div id="alerts"></div></section>
<section class="card"><h2>Per step: time by stage (mean per lane), idle by cause, weight sync, engines (requests, KV cache), GPUs</h2><div id="charts" style="display:flex;flex-wrap:wrap;gap:18px"></div><div class="legend" id="legend"></div></section>
<section class="card"><h2>Steps</h2><table><thead><tr><th>step</th><th>duration</th><th>split per role</th>
<th>weight sync</th><th>answer</th><th>Perfetto</th></tr></thead><tbody id="rows"></tbody></table></section>
<section class="card"><h2>Log lines that did not parse</h2><div id="bad" class="mut"></div></section>
</main>
<script>
"use strict";
const COLORS=["#2563eb","#16a34a","#f59e0b","#dc2626","#7c3aed","#0891b2","#db2777","#65a30d","#ea580c","#475569","#9ca3af"];
const color={};let nextColor=0;
function col(stage){if(stage==="idle")return "#d1d5db";if(!(stage in color))color[stage]=COLORS[nextColor++%COLORS.length];return color[stage];}
function el(tag,text,cls){const e=document.createElement(tag);if(text!==undefined&&text!==null)e.textContent=String(text);if(cls)e.className=cls;return e;}
function svg(tag,attrs){const e=document.createElementNS("http://www.w3.org/2000/svg",tag);for(const k in attrs)e.setAttribute(k,attrs[k]);return e;}
function sec(ns){return (ns/1e9).toFixed(3)+" s";}
function stat(label,value){const d=el("div",null,"stat");d.appendChild(el("b",value));d.appendChild(el("span",label));return d;}
function splitText(role){const m=role.mean_ns||{};const tot=Object.values(m).reduce((a,b)=>a+b,0)||1;
  return role.role+": "+Object.entries(m).filter(e=>e[1]>0).sort((a,b)=>b[1]-a[1]).map(e=>e[0]+" "+Math.round(100*e[1]/tot)+"%").join(", ");}
function stageOf(st,role){const r=(st.row.roles||[]).find(x=>x.role===role);return r?r.mean_ns:null;}
function idleOf(st,role){const idle=((st.rec.figures||{})["idle.steps"]||[])[0];if(!idle)return null;const out={};
  for(const l of idle.lanes||[]){if(l.role!==role)continue;for(const [c,ns] of Object.entries(l.causes_ns||{}))out[c]=(out[c]||0)+ns;}
  return Object.keys(out).length?out:null;}
function rowsOf(st,key){return (st.rec.figures||{})[key]||[];}
function engineOf(st,rep){const e=rowsOf(st,"telemetry.engines").find(x=>String(x.replica)===rep);return e?{running:e.running_mean||0,waiting:e.waiting_mean||0}:null;}
function kvOf(st,rep){const e=rowsOf(st,"telemetry.engines").find(x=>String(x.replica)===rep);return e&&e.kv_cache_max!=null?{"KV cache":e.kv_cache_max}:null;}
function syncOf(st){const s=rowsOf(st,"rollout.weight_sync.syncs");return s.length?{"update_weights call":s.reduce((a,x)=>a+(x.dur_ns||0),0)}:null;}
function syncText(st){const s=rowsOf(st,"rollout.weight_sync.syncs");if(!s.length)return "-";
  const per={};for(const x of s)for(const r of x.replicas||[])per[String(r.replica)]=(per[String(r.replica)]||0)+(r.dur_ns||0);
  const worst=Object.entries(per).sort((a,b)=>b[1]-a[1])[0];
  return sec(s.reduce((a,x)=>a+(x.dur_ns||0),0))+(s.length>1?" ("+s.length+" syncs)":"")+(worst?"; slowest replica "+worst[0]+": "+sec(worst[1]):"");}
function gpuOf(st,role){const out={};for(const g of rowsOf(st,"telemetry.gpus"))if(g.role===role&&g.mean!=null)out[g.stage]=g.mean;return Object.keys(out).length?out:null;}
function chart(title,steps,parts,fmt,kind){fmt=fmt||sec;
  const W=Math.max(360,steps.length*26+60),H=150,box=el("div");box.dataset.chart=kind||"stage";box.appendChild(el("div",title,"mut"));
  const s=svg("svg",{width:W,height:H,role:"img"});let max=1;
  for(const st of steps){const p=parts(st);if(p)max=Math.max(max,Object.values(p).reduce((a,b)=>a+b,0));}
  steps.forEach((st,i)=>{const p=parts(st);if(!p)return;let y=H-18;
    for(const [stage,ns] of Object.entries(p)){if(ns<=0)continue;const h=(H-30)*ns/max;y-=h;
      const rect=svg("rect",{x:40+i*26,y:y,width:20,height:Math.max(h,0.5),fill:col(stage)});
      const t=svg("title",{});t.textContent="step "+st.step+" "+stage+" "+fmt(ns);rect.appendChild(t);s.appendChild(rect);}
    const lab=svg("text",{x:40+i*26,y:H-4});lab.textContent=String(st.step);s.appendChild(lab);});
  const ax=svg("text",{x:0,y:14});ax.textContent=fmt(max);s.appendChild(ax);box.appendChild(s);return box;}
function render(d){
  document.getElementById("run").textContent=d.run_dir;
  document.getElementById("updated").textContent="updated "+new Date().toLocaleTimeString();
  const steps=d.steps.map(s=>({step:s.step,rec:s,row:((s.figures||{}).steps||[{}])[0]}));
  const stats=document.getElementById("stats");stats.replaceChildren(
    stat("steps answered",steps.length),
    stat("latest step",steps.length?steps[steps.length-1].step:"-"),
    stat("in progress",d.unfinished?("after step "+(d.unfinished.after_step??"-")):(d.pending.length?"settling "+d.pending.join(", "):"none")),
    stat("bad log lines",d.bad_lines.total),stat("files followed",d.files));
  const alerts=document.getElementById("alerts");alerts.replaceChildren();
  for(const s of d.steps){if(s.alert)alerts.appendChild(el("div","\\u26a0 "+s.alert,"alert"));}
  for(const e of d.errors){alerts.appendChild(el("div",e,"alert"));}
  if(d.unfinished)alerts.appendChild(el("div","Events after step "+(d.unfinished.after_step??"-")+" and no step marker yet: a step is running (or the run ended mid-step); it is shown when it finishes.","mut"));
  const roles=[...new Set(steps.flatMap(s=>(s.row.roles||[]).map(r=>r.role)))];
  const replicas=[...new Set(steps.flatMap(st=>rowsOf(st,"telemetry.engines").map(e=>String(e.replica))))].sort();
  const charts=document.getElementById("charts");charts.replaceChildren(...roles.map(r=>chart(r+": time by stage",steps,st=>stageOf(st,r))),
    ...roles.filter(r=>steps.some(st=>idleOf(st,r))).map(r=>chart(r+": idle by cause (all lanes)",steps,st=>idleOf(st,r),sec,"idle")),
    ...(steps.some(st=>syncOf(st))?[chart("weight sync (trainer's update_weights, summed)",steps,syncOf,sec,"sync")]:[]),
    ...replicas.map(rep=>chart("engine replica "+rep+": requests running / waiting (mean)",steps,st=>engineOf(st,rep),v=>v.toFixed(1),"engine")),
    ...replicas.filter(rep=>steps.some(st=>kvOf(st,rep))).map(rep=>chart("engine replica "+rep+": KV-cache use (max)",steps,st=>kvOf(st,rep),v=>(100*v).toFixed(0)+" %","kv")),
    ...roles.filter(r=>steps.some(st=>gpuOf(st,r))).map(r=>chart(r+": GPU busy % by stage (sum of stage means)",steps,st=>gpuOf(st,r),v=>v.toFixed(0)+" %","gpu")));
  const legend=document.getElementById("legend");legend.replaceChildren(...Object.keys(color).map(k=>{const sp=el("span",k);const i=el("i");i.style.background=color[k];sp.prepend(i);return sp;}));
  const rows=document.getElementById("rows");rows.replaceChildren();
  for(const s of steps.slice().reverse()){const tr=el("tr");tr.dataset.step=s.step;
    const c=el("td",s.step,"num");if(s.rec.corrected){c.appendChild(el("span"," corrected","tag"));}tr.appendChild(c);
    tr.appendChild(el("td",s.row.dur_ns!==undefined?sec(s.row.dur_ns):"-","num"));
    const split=el("td");for(const r of s.row.roles||[])split.appendChild(el("div",splitText(r)));tr.appendChild(split);
    tr.appendChild(el("td",syncText(s),"sync"));
    const ans=el("td",s.rec.answer);if(s.rec.alert)ans.appendChild(el("div",s.rec.alert,"alert"));tr.appendChild(ans);
    const link=el("td");const a=el("a","open in Perfetto");a.href="perfetto/#!/?url="+location.origin+"/"+s.rec.view;a.target="_blank";a.rel="noopener";link.appendChild(a);tr.appendChild(link);
    rows.appendChild(tr);}
  const bad=document.getElementById("bad");bad.replaceChildren();
  const files=Object.entries(d.bad_lines.files||{});if(!files.length)bad.textContent="none";
  for(const [f,e] of files)bad.appendChild(el("div",f+": "+e.count+" (lines "+e.lines.join(", ")+")"));
  document.body.dataset.steps=String(steps.length);}
async function tick(){try{const r=await fetch("api/steps",{cache:"no-store"});if(r.ok)render(await r.json());}catch(e){}
  setTimeout(tick,2000);}
tick();
</script></body></html>
"""


def page() -> bytes:
    return PAGE.encode("utf-8")
