// phpmq web: live parts of a page and local times. Every element with `data-live` and an id
// is read again from the same URL every data-refresh-ms and put in place (unless the user is
// typing in it); the server escapes everything, and parsed pages run no script.
"use strict";

function showLocalTimes(root) {
  for (const cell of root.querySelectorAll("[data-epoch]")) {
    const when = new Date(Number(cell.dataset.epoch) * 1000);
    if (!Number.isNaN(when.getTime())) {
      cell.title = when.toISOString();
      cell.textContent = when.toLocaleString();
    }
  }
}

async function refreshLiveParts() {
  if (document.hidden) {
    return;
  }
  let response;
  try {
    response = await fetch(window.location.href, {
      credentials: "same-origin",
      redirect: "manual",
    });
  } catch (error) {
    document.body.classList.add("stale");
    return;
  }
  if (!response.ok) {  // a redirect to the login, the console gone: keep what is shown
    document.body.classList.add("stale");
    return;
  }
  const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
  for (const part of fresh.querySelectorAll("[data-live][id]")) {
    const shown = document.getElementById(part.id);
    if (shown && !shown.contains(document.activeElement)) {
      const adopted = document.importNode(part, true);
      showLocalTimes(adopted);
      shown.replaceWith(adopted);
    }
  }
  document.body.classList.remove("stale");
  document.body.dataset.refreshed = String(Date.now());
}

document.addEventListener("DOMContentLoaded", () => {
  showLocalTimes(document);
  const every = Number(document.body.dataset.refreshMs || 0);
  if (every > 0) {
    window.setInterval(refreshLiveParts, every);
  }
});
