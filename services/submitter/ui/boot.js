/* Starts the portal once every page script is loaded (the Content-Security-Policy allows no inline script). */
"use strict";
TM.start();
