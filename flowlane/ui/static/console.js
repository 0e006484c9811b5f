// flowlane console: live regions and payloads on demand. No framework, no external assets.
"use strict";

(function () {
  const refreshMs = Number(document.body.dataset.refreshMs) || 2000;

  function loadPayload(details) {
    if (details.dataset.loaded) return;
    details.dataset.loaded = "1";
    const pre = details.querySelector("pre");
    pre.textContent = "loading…";
    fetch(details.dataset.src, { credentials: "same-origin" })
      .then((r) => r.text().then((t) => { pre.textContent = r.ok ? t : "error: " + t; }))
      .catch((e) => { pre.textContent = "error: " + e; delete details.dataset.loaded; });
  }

  function wirePayloads(root) {
    root.querySelectorAll("details.payload").forEach((d) => {
      d.addEventListener("toggle", () => { if (d.open) loadPayload(d); });
    });
  }

  // Re-fetch a region marked data-live="URL" and swap its content when it changed;
  // open payloads stay open. A region marked data-live-stop, or whose new content
  // carries data-terminal, stops refreshing.
  function live(region) {
    let last = region.innerHTML;
    async function tick() {
      if (document.visibilityState === "visible") {
        try {
          const r = await fetch(region.dataset.live, { credentials: "same-origin" });
          if (r.ok) {
            const html = await r.text();
            if (html !== last) {
              const open = [...region.querySelectorAll("details[open]")].map((d) => d.dataset.src || d.textContent);
              region.innerHTML = html;
              last = html;
              region.querySelectorAll("details").forEach((d) => {
                if (open.includes(d.dataset.src || d.textContent)) d.open = true;
              });
              wirePayloads(region);
              region.querySelectorAll("details.payload[open]").forEach(loadPayload);
            }
            if (region.querySelector("[data-terminal]")) return;
          }
        } catch (e) { /* the server may be restarting: try again */ }
      }
      setTimeout(tick, refreshMs);
    }
    if (!region.dataset.liveStop) setTimeout(tick, refreshMs);
  }

  // a graph's "full size" / "fit to page" button (a live region may replace the button)
  document.addEventListener("click", (event) => {
    if (event.target.closest("[data-graph-size]")) document.body.classList.toggle("graph-full");
  });

  document.addEventListener("DOMContentLoaded", () => {
    wirePayloads(document);
    document.querySelectorAll("[data-live]").forEach(live);
  });
})();
